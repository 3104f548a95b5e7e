// Helpers for the tokenizer tests: the golden files under tests/golden/tokenizer/.
#ifndef MOESH_COMMON_TOKENIZER_TEST_UTIL_H_
#define MOESH_COMMON_TOKENIZER_TEST_UTIL_H_

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

#ifndef MOESH_REPO_DIR
#define MOESH_REPO_DIR "."
#endif

namespace moesh::testing_util {

// tests/golden/tokenizer/<relative>.
inline std::string GoldenPath(const std::string& relative) {
  return std::string(MOESH_REPO_DIR) + "/tests/golden/tokenizer/" + relative;
}

inline std::string ReadOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(ReadOrDie(path));
}

inline std::vector<int32_t> Ids(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

// The tokenizers shipped and tested: tiny and small (DeepSeek-V3 settings), nfc (variant).
inline const std::vector<std::string>& GoldenNames() {
  static const std::vector<std::string> names = {"tiny", "small", "nfc"};
  return names;
}

}  // namespace moesh::testing_util

#endif  // MOESH_COMMON_TOKENIZER_TEST_UTIL_H_
