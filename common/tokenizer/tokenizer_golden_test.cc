// Encode and Decode against the `tokenizers` library's own output
// (tests/golden/tokenizer/<name>/golden.json, see make_tokenizer_golden.py).
#include <string>
#include <vector>

#include "common/tokenizer/test_util.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

using testing_util::GoldenPath;
using testing_util::Ids;
using testing_util::ReadJson;

class TokenizerGoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(GoldenPath(GetParam()));
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = *std::move(t);
    golden_ = ReadJson(GoldenPath(GetParam() + "/golden.json"));
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  nlohmann::json golden_;
};

TEST_P(TokenizerGoldenTest, VocabSize) {
  EXPECT_EQ(tokenizer_->vocab_size(), golden_.at("vocab_size").get<int>());
}

TEST_P(TokenizerGoldenTest, EncodesEveryCaseLikeTheLibrary) {
  const auto& cases = golden_.at("encode");
  ASSERT_GT(cases.size(), 500u);
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    absl::StatusOr<std::vector<int32_t>> plain = tokenizer_->Encode(text, false);
    absl::StatusOr<std::vector<int32_t>> with_special = tokenizer_->Encode(text, true);
    ASSERT_TRUE(plain.ok() && with_special.ok()) << plain.status() << with_special.status();
    EXPECT_EQ(*plain, Ids(c.at("ids")))
        << "text " << c.at("text").dump() << "\nlibrary's tokens " << c.at("tokens").dump();
    EXPECT_EQ(*with_special, Ids(c.at("ids_with_special"))) << c.at("text").dump();
  }
}

TEST_P(TokenizerGoldenTest, DecodesEncodedCasesLikeTheLibrary) {
  for (const auto& c : golden_.at("encode")) {
    const std::vector<int32_t> ids = Ids(c.at("ids_with_special"));
    EXPECT_EQ(tokenizer_->Decode(ids, false), c.at("decode").get<std::string>())
        << c.at("text").dump();
    EXPECT_EQ(tokenizer_->Decode(ids, true), c.at("decode_skip_special").get<std::string>())
        << c.at("text").dump();
  }
}

TEST_P(TokenizerGoldenTest, DecodesArbitraryIdsLikeTheLibrary) {
  // Byte tokens that split or break UTF-8, unknown ids, random id sequences.
  ASSERT_GT(golden_.at("decode").size(), 200u);
  for (const auto& c : golden_.at("decode")) {
    const std::vector<int32_t> ids = Ids(c.at("ids"));
    EXPECT_EQ(tokenizer_->Decode(ids, false), c.at("text").get<std::string>()) << c.dump();
    EXPECT_EQ(tokenizer_->Decode(ids, true), c.at("text_skip_special").get<std::string>())
        << c.dump();
  }
}

TEST_P(TokenizerGoldenTest, RoundTripsTextWithoutSpecialTokens) {
  for (const auto& c : golden_.at("encode")) {
    const std::string text = c.at("text");
    if (GetParam() == "nfc" || text.find("<") != std::string::npos) continue;
    EXPECT_EQ(tokenizer_->Decode(*tokenizer_->Encode(text, true), true), text);
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, TokenizerGoldenTest,
                         ::testing::ValuesIn(testing_util::GoldenNames()));

}  // namespace
}  // namespace moesh
