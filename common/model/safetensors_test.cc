#include "common/model/safetensors.h"

#include <cstring>
#include <filesystem>
#include <functional>

#include "base/file_util.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

std::string TestDir(const std::string& name) {
  std::string dir = JoinPath(::testing::TempDir(), "safetensors_test_" + name);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

SafetensorsWriter TwoTensors() {
  SafetensorsWriter w;
  w.Add("a", DType::kF32, {2, 3}, Bytes({1, 2, 3, 4, 5, 6}));
  w.Add("b.weight", DType::kBF16, {2}, {0x80, 0x3f, 0x00, 0xc0});  // 1.0, -2.0
  return w;
}

TEST(SafetensorsTest, RoundTrip) {
  const std::string dir = TestDir("roundtrip");
  ASSERT_TRUE(TwoTensors().WriteFile(JoinPath(dir, "x.safetensors")).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(JoinPath(dir, "x.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const TensorView& a = (*f)->tensors().at("a");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.dtype, DType::kF32);
  EXPECT_EQ(reinterpret_cast<const float*>(a.data)[5], 6.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 8, 0u);
  const TensorView& b = (*f)->tensors().at("b.weight");
  float out[2];
  ConvertToF32(b.dtype, b.data, 2, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
}

TEST(SafetensorsTest, ShardedCheckpoint) {
  const std::string dir = TestDir("sharded");
  SafetensorsWriter w = TwoTensors();
  w.Add("c", DType::kF32, {4}, Bytes({1, 1, 1, 1}));
  ASSERT_TRUE(w.WriteCheckpoint(dir, 2).ok());
  EXPECT_TRUE(FileExists(JoinPath(dir, "model-00001-of-00002.safetensors")));
  EXPECT_TRUE(FileExists(JoinPath(dir, "model-00002-of-00002.safetensors")));
  absl::StatusOr<std::unique_ptr<Checkpoint>> c = Checkpoint::Open(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->tensors().size(), 3u);
  EXPECT_TRUE((*c)->Get("c").ok());
  EXPECT_EQ((*c)->Get("zzz").status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, IndexNamingAbsentTensor) {
  const std::string dir = TestDir("badindex");
  ASSERT_TRUE(TwoTensors().WriteCheckpoint(dir, 2).ok());
  const std::string index = JoinPath(dir, "model.safetensors.index.json");
  std::string text = *ReadFileToString(index);
  text.replace(text.find("\"weight_map\": {"), 15,
               "\"weight_map\": {\"ghost\": \"model-00001-of-00002.safetensors\", ");
  ASSERT_TRUE(WriteStringToFile(index, text).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> c = Checkpoint::Open(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(c.status().message().find("ghost"), std::string::npos) << c.status();
}

TEST(SafetensorsTest, MissingShardFile) {
  const std::string dir = TestDir("missingshard");
  ASSERT_TRUE(TwoTensors().WriteCheckpoint(dir, 2).ok());
  std::filesystem::remove(JoinPath(dir, "model-00002-of-00002.safetensors"));
  absl::StatusOr<std::unique_ptr<Checkpoint>> c = Checkpoint::Open(dir);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("model-00002-of-00002.safetensors"), std::string::npos);
}

TEST(SafetensorsTest, EmptyDirectory) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> c = Checkpoint::Open(TestDir("empty"));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
}

// A corrupted copy of a valid two-tensor file, and what its error must say.
struct Corruption {
  const char* name;
  std::function<void(std::string&)> edit;
  absl::StatusCode code;
  const char* message;
};

class CorruptFileTest : public ::testing::TestWithParam<Corruption> {};

TEST_P(CorruptFileTest, ClearError) {
  const std::string dir = TestDir(GetParam().name);
  const std::string path = JoinPath(dir, "model.safetensors");
  ASSERT_TRUE(TwoTensors().WriteFile(path).ok());
  std::string bytes = *ReadFileToString(path);
  GetParam().edit(bytes);
  ASSERT_TRUE(WriteStringToFile(path, bytes).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), GetParam().code) << f.status();
  EXPECT_NE(f.status().message().find(GetParam().message), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status();
}

void Replace(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  ASSERT_EQ(from.size(), to.size());  // keep the header length valid
  s.replace(at, from.size(), to);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CorruptFileTest,
    ::testing::Values(Corruption{"truncated_data", [](std::string& s) { s.resize(s.size() - 4); },
                                 absl::StatusCode::kDataLoss, "truncated"},
                      Corruption{"tiny_file", [](std::string& s) { s.resize(5); },
                                 absl::StatusCode::kDataLoss, "8-byte"},
                      Corruption{"huge_header_len", [](std::string& s) { s[6] = 0x10; },
                                 absl::StatusCode::kDataLoss, "header length"},
                      Corruption{"garbage_header", [](std::string& s) { s[8] = '#'; },
                                 absl::StatusCode::kDataLoss, "not a JSON object"},
                      Corruption{"unsupported_dtype",
                                 [](std::string& s) { Replace(s, "\"BF16\"", "\"F64\"\x20"); },
                                 absl::StatusCode::kInvalidArgument, "b.weight"},
                      Corruption{"shape_vs_bytes",
                                 [](std::string& s) { Replace(s, "[2,3]", "[3,3]"); },
                                 absl::StatusCode::kDataLoss, "\"a\""},
                      Corruption{"missing_offsets",
                                 [](std::string& s) { Replace(s, "data_offsets", "data_offsetz"); },
                                 absl::StatusCode::kDataLoss, "data_offsets"}),
    [](const ::testing::TestParamInfo<Corruption>& info) { return std::string(info.param.name); });

TEST(SafetensorsTest, MissingFile) {
  EXPECT_EQ(SafetensorsFile::Open("/nonexistent/x.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace moesh
