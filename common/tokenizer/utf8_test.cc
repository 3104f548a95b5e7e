#include "common/tokenizer/utf8.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace moesh {
namespace {

const char kFffd[] = "\xEF\xBF\xBD";

TEST(Utf8Test, ValidatesWellFormedText) {
  for (const char* ok : {"", "abc", "caf\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
                         "\xEF\xBF\xBF", "\xF4\x8F\xBF\xBF", "\xED\x9F\xBF", "\xEE\x80\x80"}) {
    EXPECT_TRUE(ValidateUtf8(ok).ok()) << ok;
  }
  EXPECT_TRUE(ValidateUtf8(std::string("a\0b", 3)).ok());
}

TEST(Utf8Test, RejectsIllFormedTextWithOffset) {
  struct Case {
    std::string bytes;
    std::string offset;
  };
  for (const Case& c : std::vector<Case>{{"\x80", "offset 0"},
                                         {"ab\xC0\x80", "offset 2"},  // overlong
                                         {"\xC1\xBF", "offset 0"},
                                         {"\xE0\x80\x80", "offset 0"},      // overlong
                                         {"x\xED\xA0\x80", "offset 1"},     // surrogate
                                         {"\xF4\x90\x80\x80", "offset 0"},  // > U+10FFFF
                                         {"\xF5\x80\x80\x80", "offset 0"},
                                         {"\xFF", "offset 0"},
                                         {"abc\xE4\xB8", "offset 3"}}) {  // truncated
    absl::Status s = ValidateUtf8(c.bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.message()).find(c.offset), std::string::npos) << s;
  }
}

TEST(Utf8Test, EncodesAndDecodesEveryScalarValue) {
  std::string text;
  std::vector<char32_t> expected;
  for (char32_t c = 0; c <= 0x10FFFF; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    AppendUtf8(c, &text);
    expected.push_back(c);
  }
  ASSERT_TRUE(ValidateUtf8(text).ok());
  std::vector<char32_t> cps;
  std::vector<size_t> offsets;
  DecodeUtf8(text, &cps, &offsets);
  EXPECT_EQ(cps, expected);
  EXPECT_EQ(offsets.size(), cps.size() + 1);
  EXPECT_EQ(offsets.back(), text.size());
}

// Rust's String::from_utf8_lossy: one U+FFFD per maximal subpart.
TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  struct Case {
    std::string in, out;
  };
  const std::string f = kFffd;
  for (const Case& c : std::vector<Case>{{"ok", "ok"},
                                         {"\xE4", f},
                                         {"\xE4"
                                          "a",
                                          f + "a"},
                                         {"\xF0\x9F", f},
                                         {"\xF0\x9F\x98", f},
                                         {"\xF0\x9F\x98"
                                          "\xF0\x9F\x98",
                                          f + f},
                                         {"\xC0\x80", f + f},
                                         {"\xE0\x80\x80", f + f + f},
                                         {"\xED\xA0\x80", f + f + f},
                                         {"\xF4\x90\x80\x80", f + f + f + f},
                                         {"\xE4\xB8\x41", f + "A"},
                                         {"\x80\x80", f + f},
                                         {"\xFF\xFE", f + f},
                                         {"a\xE4\xB8\xAD"
                                          "b",
                                          "a\xE4\xB8\xAD"
                                          "b"}}) {
    EXPECT_EQ(Utf8Lossy(c.in), c.out) << c.in;
  }
}

TEST(Utf8Test, NonFinalLossyHoldsBackAnUnfinishedCharacter) {
  std::string out;
  EXPECT_EQ(AppendUtf8Lossy("ab\xE4\xB8", /*final=*/false, &out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(AppendUtf8Lossy("\xE4\x41\xE4", /*final=*/false, &out), 2u);
  EXPECT_EQ(out, std::string(kFffd) + "A");
  out.clear();
  EXPECT_EQ(AppendUtf8Lossy("ab\xE4\xB8", /*final=*/true, &out), 4u);
  EXPECT_EQ(out, std::string("ab") + kFffd);
}

}  // namespace
}  // namespace moesh
