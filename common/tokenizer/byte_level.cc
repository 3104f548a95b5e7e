#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/tokenizer/utf8.h"

namespace moesh {
namespace {

struct Tables {
  std::array<std::string, 256> byte_to_char;
  std::array<int16_t, 324> char_to_byte;  // code points 0..323; -1: not in the alphabet

  Tables() {
    char_to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c = printable ? b : next++;
      AppendUtf8(c, &byte_to_char[b]);
      char_to_byte[c] = static_cast<int16_t>(b);
    }
  }
};

const Tables& GetTables() {
  static const Tables* const tables = new Tables();
  return *tables;
}

}  // namespace

const std::string& ByteLevelChar(uint8_t b) { return GetTables().byte_to_char[b]; }

void AppendByteLevel(absl::string_view bytes, std::string* out) {
  const Tables& t = GetTables();
  for (char b : bytes) out->append(t.byte_to_char[static_cast<uint8_t>(b)]);
}

void AppendTokenBytes(absl::string_view token, std::string* out) {
  const Tables& t = GetTables();
  const size_t start = out->size();
  for (size_t pos = 0; pos < token.size();) {
    const Utf8Step step = DecodeUtf8At(token, pos);
    if (step.kind != Utf8Step::kValid || step.code_point >= t.char_to_byte.size() ||
        t.char_to_byte[step.code_point] < 0) {
      out->resize(start);
      out->append(token.data(), token.size());
      return;
    }
    out->push_back(static_cast<char>(t.char_to_byte[step.code_point]));
    pos += step.length;
  }
}

}  // namespace moesh
