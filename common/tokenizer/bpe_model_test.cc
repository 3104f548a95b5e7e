#include "common/tokenizer/bpe_model.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moesh {
namespace {

using Json = nlohmann::json;

Json SmallModel() {
  return Json::parse(R"({
    "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
    "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
    "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "aa": 6},
    "merges": [["a", "b"], ["b", "c"], ["ab", "c"], ["a", "a"]]
  })");
}

absl::StatusOr<BpeModel> Load(const Json& j) {
  return BpeModel::FromJson(JsonField(j, "tok.json", "model"));
}

std::vector<int32_t> Encode(const BpeModel& m, const std::string& word) {
  std::vector<int32_t> ids;
  m.Encode(word, &ids);
  return ids;
}

TEST(BpeModelTest, MergesLowestRankFirstThenLeftmost) {
  absl::StatusOr<BpeModel> m = Load(SmallModel());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Encode(*m, "abc"), (std::vector<int32_t>{5}));  // ab, then ab+c
  EXPECT_EQ(Encode(*m, "bc"), (std::vector<int32_t>{4}));
  EXPECT_EQ(Encode(*m, "aaa"), (std::vector<int32_t>{6, 0}));  // leftmost pair first
  EXPECT_EQ(Encode(*m, "aab"), (std::vector<int32_t>{0, 3}));  // "a b" outranks "a a"
  // An unknown 'x' is dropped, and its neighbours then merge, as in tokenizers.
  EXPECT_EQ(Encode(*m, "axb"), (std::vector<int32_t>{3}));
  EXPECT_EQ(Encode(*m, "xcx"), (std::vector<int32_t>{2}));
  EXPECT_EQ(Encode(*m, ""), (std::vector<int32_t>{}));
  EXPECT_EQ(m->max_id(), 6);
  EXPECT_EQ(*m->IdToToken(5), "abc");
  EXPECT_EQ(m->IdToToken(7), nullptr);
  EXPECT_EQ(m->TokenToId("bc"), 4);
}

TEST(BpeModelTest, ReadsLegacyStringMerges) {
  Json j = SmallModel();
  j["merges"] = Json::array({"a b", "b c", "ab c", "a a"});
  absl::StatusOr<BpeModel> m = Load(j);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Encode(*m, "abc"), (std::vector<int32_t>{5}));
}

TEST(BpeModelTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  Json j = SmallModel();
  j["vocab"]["ca"] = 7;
  j["merges"] = Json::array({"a b"});
  j["ignore_merges"] = true;
  absl::StatusOr<BpeModel> m = Load(j);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Encode(*m, "ca"), (std::vector<int32_t>{7}));
  EXPECT_EQ(Encode(*m, "cab"), (std::vector<int32_t>{2, 3}));
}

TEST(BpeModelTest, RefusesUnsupportedOrCorruptModelsNamingTheField) {
  struct Case {
    const char* patch;  // JSON merge-patch onto SmallModel()
    const char* expected;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"type": "WordPiece"})", "model.type: \"WordPiece\" is not supported"},
           {R"({"byte_fallback": true})", "model.byte_fallback: is not supported"},
           {R"({"unk_token": "<unk>"})", "model.unk_token: is not supported"},
           {R"({"dropout": 0.1})", "model.dropout: is not supported"},
           {R"({"continuing_subword_prefix": "##"})", "model.continuing_subword_prefix"},
           {R"({"vocab": null})", "model.vocab: missing"},
           {R"({"vocab": {"a": "zero"}})", "model.vocab.a: expected an integer"},
           {R"({"vocab": {"a": 0, "b": 0}})", "model.vocab.b: id 0 is used twice"},
           {R"({"vocab": {"a": -1}})", "model.vocab.a: id -1 is out of range"},
           {R"({"merges": [["a", "x"]]})", "model.merges[0]: token \"x\" is not in model.vocab"},
           {R"({"merges": ["a b", "c a"]})", "model.merges[1]: token \"ca\" is not in model.vocab"},
           {R"({"merges": ["ab"]})", "model.merges[0]: expected \"left right\""},
           {R"({"merges": [1]})", "model.merges[0]: expected"},
           {R"({"merges": {}})", "model.merges: expected an array"}}) {
    Json j = SmallModel();
    j.merge_patch(Json::parse(c.patch));
    absl::StatusOr<BpeModel> m = Load(j);
    ASSERT_FALSE(m.ok()) << c.patch;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find(std::string("tok.json: field ") + c.expected),
              absl::string_view::npos)
        << m.status();
  }
}

}  // namespace
}  // namespace moesh
