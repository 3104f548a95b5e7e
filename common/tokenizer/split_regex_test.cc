#include "common/tokenizer/split_regex.h"

#include <string>
#include <vector>

#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/test_util.h"
#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

using testing_util::GoldenPath;
using testing_util::ReadJson;

// DeepSeek-V3's Split patterns, as its tokenizer.json holds them (\r \n literal).
const char kDigits[] = "\\p{N}{1,3}";
const char kCjk[] = "[一-龥぀-ゟ゠-ヿ]+";
const char kMain[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

std::vector<std::string> Matches(const SplitRegex& re, const std::string& text) {
  std::vector<char32_t> cps;
  std::vector<size_t> offsets;
  DecodeUtf8(text, &cps, &offsets);
  std::vector<std::pair<size_t, size_t>> spans;
  re.FindAll(cps, &spans);
  std::vector<std::string> out;
  for (auto [b, e] : spans) out.push_back(text.substr(offsets[b], offsets[e] - offsets[b]));
  return out;
}

SplitRegex CompileOrDie(const std::string& pattern) {
  absl::StatusOr<SplitRegex> re = SplitRegex::Compile(pattern);
  EXPECT_TRUE(re.ok()) << re.status();
  return *std::move(re);
}

TEST(SplitRegexTest, CompilesDeepSeekPatterns) {
  for (const char* p : {kDigits, kCjk, kMain}) EXPECT_TRUE(SplitRegex::Compile(p).ok()) << p;
  // The same with \r\n escaped, and GPT-2's ByteLevel regex.
  EXPECT_TRUE(SplitRegex::Compile("[^\\r\\n\\p{L}]?\\p{L}+|\\s*[\\r\\n]+").ok());
  EXPECT_TRUE(
      SplitRegex::Compile(
          "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+")
          .ok());
}

TEST(SplitRegexTest, RefusesWhatItDoesNotImplementNamingThePattern) {
  for (const char* p :
       {"(?i:'s|'t)", "(a|b)",  "a.b",    "^a",    "a$",      "\\d+",    "\\w+",  "a+?",
        "a++",        "a*",     "x|",     "",      "[a-",     "[]a]",    "[[a]]", "[a&&b]",
        "\\p{Han}",   "\\p{L",  "a{2,1}", "a{,3}", "\\x41",   "\\u0041", "\\b",   "a{1001}",
        "(?=a)",      "(?!a)+", "*a",     "[z-a]", "[\\s-z]", "\xFF"}) {
    absl::StatusOr<SplitRegex> re = SplitRegex::Compile(p);
    ASSERT_FALSE(re.ok()) << p;
    EXPECT_EQ(re.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(re.status().message().find("unsupported Split regex"), absl::string_view::npos);
  }
  absl::Status s = SplitRegex::Compile("\\p{N}|\\d").status();
  EXPECT_NE(s.message().find("\"\\p{N}|\\d\""), absl::string_view::npos) << s;
}

TEST(SplitRegexTest, BacktracksLikeOniguruma) {
  const SplitRegex main = CompileOrDie(kMain);
  using V = std::vector<std::string>;
  // \s+(?!\S) leaves the last space to the next word; at the end it takes all.
  EXPECT_EQ(Matches(main, "a   b  "), (V{"a", "  ", " b", "  "}));
  // \s*[\r\n]+ ends after the last newline of a whitespace run.
  EXPECT_EQ(Matches(main, "x \n \n  y"), (V{"x", " \n \n", " ", " y"}));
  // Punctuation then ASCII letters, and " ?[\p{P}\p{S}]+[\r\n]*".
  EXPECT_EQ(Matches(main, "foo.bar !!\n\n"), (V{"foo", ".bar", " !!\n\n"}));
  // The optional leading non-letter before letters and marks.
  EXPECT_EQ(Matches(main,
                    "\xCC\x81"
                    "abc 1x"),
            (V{"\xCC\x81"
               "abc",
               " ", "1x"}));
  EXPECT_EQ(Matches(CompileOrDie(kDigits), "12345 6"), (V{"123", "45", "6"}));
  EXPECT_EQ(Matches(CompileOrDie(kCjk), "ab中文カナーx"), (V{"中文カナー"}));
  EXPECT_EQ(Matches(SplitRegex::Literal("ab"), "xababa"), (V{"ab", "ab"}));
}

TEST(SplitRegexTest, CategoriesMatchTheTokenizersLibrary) {
  // unicode_classes.json: what Oniguruma (inside `tokenizers`) matches for each class.
  const nlohmann::json classes = ReadJson(GoldenPath("unicode_classes.json"));
  for (const auto& [key, pattern] :
       std::vector<std::pair<std::string, std::string>>{{"L", "\\p{L}"},
                                                        {"M", "\\p{M}"},
                                                        {"N", "\\p{N}"},
                                                        {"P", "\\p{P}"},
                                                        {"S", "\\p{S}"},
                                                        {"s", "\\s"}}) {
    const SplitRegex re = CompileOrDie(pattern);
    std::vector<bool> expected(0x110000, false);
    for (const auto& range : classes.at(key)) {
      for (uint32_t c = range[0].get<uint32_t>(); c <= range[1].get<uint32_t>(); ++c) {
        expected[c] = true;
      }
    }
    std::vector<char32_t> all;
    for (char32_t c = 0; c < 0x110000; ++c) {
      if (c < 0xD800 || c > 0xDFFF) all.push_back(c);
    }
    std::vector<std::pair<size_t, size_t>> spans;
    re.FindAll(all, &spans);
    std::vector<bool> got(0x110000, false);
    for (auto [b, e] : spans) {
      for (size_t i = b; i < e; ++i) got[all[i]] = true;
    }
    int mismatches = 0;
    for (char32_t c : all) {
      if (got[c] != expected[c] && ++mismatches <= 5) {
        ADD_FAILURE() << key << ": U+" << std::hex << static_cast<uint32_t>(c) << " ICU says "
                      << got[c] << ", tokenizers says " << expected[c];
      }
    }
    EXPECT_EQ(mismatches, 0) << key;
  }
}

TEST(SplitRegexTest, PreTokenizesLikeTheTokenizersLibrary) {
  std::vector<SplitRegex> splits;
  for (const char* p : {kDigits, kCjk, kMain}) splits.push_back(CompileOrDie(p));
  const PreTokenizer pre(std::move(splits));
  const nlohmann::json golden = ReadJson(GoldenPath("tiny/golden.json"));
  ASSERT_GT(golden.at("pretokenize").size(), 500u);
  for (const auto& c : golden.at("pretokenize")) {
    const std::string text = c.at("text");
    std::vector<absl::string_view> pieces;
    pre.Split(text, &pieces);
    EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.end()),
              c.at("pieces").get<std::vector<std::string>>())
        << c.at("text").dump();
  }
}

}  // namespace
}  // namespace moesh
