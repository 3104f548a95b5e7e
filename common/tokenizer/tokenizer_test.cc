#include "common/tokenizer/tokenizer.h"

#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/model/random_checkpoint.h"
#include "common/tokenizer/embedded_tokenizers.h"
#include "common/tokenizer/test_util.h"
#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

using Json = nlohmann::json;
using testing_util::GoldenPath;
using testing_util::Ids;
using testing_util::ReadJson;
using testing_util::ReadOrDie;

const char kBos[] = "<｜begin▁of▁sentence｜>";
const char kEos[] = "<｜end▁of▁sentence｜>";

std::unique_ptr<Tokenizer> Tiny() {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(GoldenPath("tiny"));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

TEST(TokenizerTest, AnswersVocabularyQueries) {
  std::unique_ptr<Tokenizer> t = Tiny();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 512);
  EXPECT_EQ(t->TokenId(kBos), 0);
  EXPECT_EQ(t->TokenId(kEos), 1);
  EXPECT_EQ(t->TokenId("Ġ"), 230);  // a space, in byte-level spelling
  EXPECT_EQ(t->TokenId("no such token"), std::nullopt);
  EXPECT_TRUE(t->IsSpecial(0));
  EXPECT_FALSE(t->IsSpecial(230));
  EXPECT_EQ(t->TokenText(0), kBos);
  EXPECT_EQ(t->TokenText(-1), std::nullopt);
  EXPECT_EQ(t->TokenText(512), std::nullopt);
}

TEST(TokenizerTest, EncodesEdgeCases) {
  std::unique_ptr<Tokenizer> t = Tiny();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(*t->Encode("", false), std::vector<int32_t>{});
  EXPECT_EQ(*t->Encode("", true), std::vector<int32_t>{0});
  EXPECT_EQ(*t->Encode(std::string(kBos) + kEos, false), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(t->Decode({0, 230, 1, -5, 100000}, true), " ");  // unknown ids are skipped
  for (const std::string bad : {"\xFF", "ok\xE4\xB8", "\xED\xA0\x80", "\xC0\xAF"}) {
    absl::StatusOr<std::vector<int32_t>> ids = t->Encode(bad, true);
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// Byte-level BPE loses nothing: any text without added tokens decodes back to itself.
TEST(TokenizerTest, RoundTripsRandomText) {
  std::unique_ptr<Tokenizer> t = Tiny();
  ASSERT_NE(t, nullptr);
  std::mt19937 rng(5);
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0, 0x7F},      {0x80, 0x7FF},    {0x800, 0xD7FF},    {0xE000, 0xFFFF}, {0x10000, 0x10FFFF},
      {0x300, 0x36F}, {0x4E00, 0x9FFF}, {0x1F300, 0x1FAFF}, {0x2000, 0x206F}};
  for (int i = 0; i < 300; ++i) {
    std::string text;
    for (int n = rng() % 40; n > 0; --n) {
      const auto& [lo, hi] = ranges[rng() % ranges.size()];
      AppendUtf8(lo + rng() % (hi - lo + 1), &text);
    }
    absl::StatusOr<std::vector<int32_t>> ids = t->Encode(text, true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(t->Decode(*ids, /*skip_special_tokens=*/true), text);
  }
}

TEST(TokenizerTest, ReadsLegacyStringMergesIdentically) {
  Json doc = ReadJson(GoldenPath("small/tokenizer.json"));
  for (Json& merge : doc["model"]["merges"]) {
    merge = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJson(doc.dump(), "legacy.json");
  ASSERT_TRUE(t.ok()) << t.status();
  const Json golden = ReadJson(GoldenPath("small/golden.json"));
  for (const auto& c : golden.at("encode")) {
    EXPECT_EQ(*(*t)->Encode(c.at("text").get<std::string>(), true), Ids(c.at("ids_with_special")));
  }
}

TEST(TokenizerTest, LoadReportsMissingFiles) {
  EXPECT_EQ(Tokenizer::Load("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
  const std::string dir = ::testing::TempDir() + "/empty_model_dir";
  std::filesystem::create_directories(dir);
  absl::Status s = Tokenizer::Load(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("tokenizer.json"), absl::string_view::npos) << s;
}

TEST(TokenizerTest, RefusesCorruptOrUnsupportedFilesNamingFileAndField) {
  const Json tiny = ReadJson(GoldenPath("tiny/tokenizer.json"));
  struct Case {
    std::function<void(Json&)> edit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](Json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       "field normalizer.type: normalizer \"NFKC\" is not supported"},
      {[](Json& j) {
         j["normalizer"]["normalizers"] = {{{"type", "Lowercase"}}};
       },
       "field normalizer.normalizers[0].type"},
      {[](Json& j) { j["pre_tokenizer"]["pretokenizers"][2]["pattern"]["Regex"] = "(?i:'s)|\\s+"; },
       "field pre_tokenizer.pretokenizers[2].pattern.Regex: unsupported Split regex "
       "\"(?i:'s)|\\s+\""},
      {[](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "field pre_tokenizer.pretokenizers[0].behavior: \"Removed\" is not supported"},
      {[](Json& j) { j["pre_tokenizer"]["pretokenizers"][1]["invert"] = true; },
       "field pre_tokenizer.pretokenizers[1].invert"},
      {[](Json& j) { j["pre_tokenizer"]["pretokenizers"][3]["use_regex"] = true; },
       "field pre_tokenizer.pretokenizers[3].use_regex: must be false"},
      {[](Json& j) { j["pre_tokenizer"]["pretokenizers"][3]["add_prefix_space"] = true; },
       "field pre_tokenizer.pretokenizers[3].add_prefix_space: must be false"},
      {[](Json& j) {
         std::swap(j["pre_tokenizer"]["pretokenizers"][0], j["pre_tokenizer"]["pretokenizers"][3]);
       },
       "field pre_tokenizer.pretokenizers[0]: ByteLevel must be the last step"},
      {[](Json& j) {
         j["pre_tokenizer"]["pretokenizers"][3] = {{"type", "Metaspace"}};
       },
       "field pre_tokenizer.pretokenizers[3].type: \"Metaspace\" is not supported"},
      {[](Json& j) { j["pre_tokenizer"]["pretokenizers"].erase(3); },
       "field pre_tokenizer.pretokenizers: must end with a ByteLevel step"},
      {[](Json& j) { j["pre_tokenizer"] = nullptr; }, "field pre_tokenizer: missing"},
      {[](Json& j) {
         j["decoder"] = {{"type", "Metaspace"}};
       },
       "field decoder.type: \"Metaspace\" is not supported"},
      {[](Json& j) { j.erase("decoder"); }, "field decoder: missing"},
      {[](Json& j) { j["truncation"] = Json::object(); }, "field truncation: is not supported"},
      {[](Json& j) { j["added_tokens"][0]["lstrip"] = true; },
       "field added_tokens[0].lstrip: true is not supported"},
      {[](Json& j) { j["added_tokens"][1]["id"] = 7; },
       "field added_tokens[1].id: is 7 but model.vocab gives"},
      {[](Json& j) { j["added_tokens"][1]["content"] = ""; },
       "field added_tokens[1].content: must be a non-empty UTF-8 string"},
      {[](Json& j) {
         j["added_tokens"][1]["content"] = "x";
         j["added_tokens"][1]["id"] = 600;
       },
       "field added_tokens[1].id: is 600 but model.vocab gives \"x\""},
      {[](Json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       "field post_processor.type: \"BertProcessing\" is not supported"},
      {[](Json& j) { j["post_processor"]["single"][0]["SpecialToken"]["id"] = "<s>"; },
       "field post_processor.special_tokens.<s>.ids: missing"},
      {[](Json& j) { j["post_processor"]["special_tokens"][kBos]["ids"][0] = 9999; },
       "field post_processor: adds id 9999, which no token has"},
      {[](Json& j) { j.erase("model"); }, "field model: missing"},
      {[](Json& j) { j["model"]["merges"][0] = "nospace"; }, "field model.merges[0]"},
      {[](Json& j) { j = Json::array(); }, "field (top level): expected an object"},
  };
  for (const Case& c : cases) {
    Json j = tiny;
    c.edit(j);
    absl::Status s = Tokenizer::FromJson(j.dump(), "tok.json").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_NE(s.message().find("tok.json: " + c.expected), absl::string_view::npos)
        << "want: " << c.expected << "\n got: " << s;
  }
  absl::Status s = Tokenizer::FromJson("{\"model\": ", "cut.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cut.json: not valid JSON"), absl::string_view::npos) << s;
}

TEST(TokenizerTest, EmbeddedTokenizersAreTheGoldenFilesAndFitThePresets) {
  EXPECT_EQ(EmbeddedTokenizerJson("huge"), std::nullopt);
  for (const std::string preset : {"tiny", "small"}) {
    std::optional<absl::string_view> json = EmbeddedTokenizerJson(preset);
    ASSERT_TRUE(json.has_value());
    EXPECT_EQ(*json, ReadOrDie(GoldenPath(preset + "/tokenizer.json")));
    for (const std::string family : {"v2-lite", "v2", "v3"}) {
      absl::StatusOr<ModelConfig> config = PresetConfig(family, preset);
      ASSERT_TRUE(config.ok()) << config.status();
      RandomCheckpointOptions options;
      options.tokenizer_json = std::string(*json);
      const std::string dir = ::testing::TempDir() + "/tok_" + family + "_" + preset;
      ASSERT_TRUE(WriteRandomCheckpoint(*config, dir, options).ok());
      absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_LE((*t)->vocab_size(), config->vocab_size);
      EXPECT_EQ((*t)->TokenId(kBos), config->bos_token_id);
      EXPECT_EQ((*t)->TokenId(kEos), config->eos_token_ids.at(0));
    }
  }
}

}  // namespace
}  // namespace moesh
