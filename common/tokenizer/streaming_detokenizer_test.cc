#include "common/tokenizer/streaming_detokenizer.h"

#include <string>
#include <vector>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/test_util.h"
#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

using testing_util::GoldenPath;
using testing_util::Ids;
using testing_util::ReadJson;

// Feeds ids one at a time; every piece must be well-formed UTF-8.
std::string Stream(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip) {
  StreamingDetokenizer detokenizer(&tokenizer, skip);
  std::string text;
  for (int32_t id : ids) {
    const std::string piece = detokenizer.Next(id);
    EXPECT_TRUE(ValidateUtf8(piece).ok()) << piece;
    EXPECT_LT(detokenizer.pending_bytes(), 4u);
    text += piece;
  }
  const std::string tail = detokenizer.Flush();
  EXPECT_TRUE(ValidateUtf8(tail).ok());
  EXPECT_EQ(detokenizer.pending_bytes(), 0u);
  return text + tail;
}

TEST(StreamingDetokenizerTest, ReproducesDecodeOnEveryGolden) {
  for (const std::string& name : testing_util::GoldenNames()) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(GoldenPath(name));
    ASSERT_TRUE(t.ok()) << t.status();
    const nlohmann::json golden = ReadJson(GoldenPath(name + "/golden.json"));
    for (const auto& c : golden.at("encode")) {
      const std::vector<int32_t> ids = Ids(c.at("ids_with_special"));
      EXPECT_EQ(Stream(**t, ids, false), c.at("decode").get<std::string>()) << c.dump();
      EXPECT_EQ(Stream(**t, ids, true), c.at("decode_skip_special").get<std::string>());
    }
    for (const auto& c : golden.at("decode")) {
      const std::vector<int32_t> ids = Ids(c.at("ids"));
      EXPECT_EQ(Stream(**t, ids, false), c.at("text").get<std::string>()) << c.dump();
      EXPECT_EQ(Stream(**t, ids, true), c.at("text_skip_special").get<std::string>());
    }
  }
}

TEST(StreamingDetokenizerTest, HoldsBackASplitCharacterUntilItCompletes) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(GoldenPath("tiny"));
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<int32_t> bytes;  // 中 = E4 B8 AD, one byte token each
  for (uint8_t b : {0xE4, 0xB8, 0xAD}) bytes.push_back(*(*t)->TokenId(ByteLevelChar(b)));
  StreamingDetokenizer d(t->get(), /*skip_special_tokens=*/true);
  EXPECT_EQ(d.Next(bytes[0]), "");
  EXPECT_EQ(d.Next(bytes[1]), "");
  EXPECT_EQ(d.pending_bytes(), 2u);
  EXPECT_EQ(d.Next(bytes[2]), "中");
  EXPECT_EQ(d.Next(1), "");  // EOS is skipped
  EXPECT_EQ(d.Next(bytes[0]), "");
  EXPECT_EQ(d.Next(*(*t)->TokenId("a")),
            "\xEF\xBF\xBD"
            "a");  // E4 then 'a': broken
  EXPECT_EQ(d.Next(bytes[0]), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");  // the stream ends mid-character
  EXPECT_EQ(d.Next(*(*t)->TokenId("a")), "a");
}

}  // namespace
}  // namespace moesh
