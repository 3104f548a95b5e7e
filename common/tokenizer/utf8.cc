#include "common/tokenizer/utf8.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace moesh {

Utf8Step DecodeUtf8At(absl::string_view bytes, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) return {Utf8Step::kValid, 1, lead};
  size_t length;
  uint8_t lo = 0x80, hi = 0xBF;  // the range allowed for the second byte
  char32_t c;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    c = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    c = lead & 0x0F;
    if (lead == 0xE0) lo = 0xA0;  // no overlongs
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    c = lead & 0x07;
    if (lead == 0xF0) lo = 0x90;  // no overlongs
    if (lead == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return {Utf8Step::kInvalid, 1, 0};  // 80..C1 and F5..FF never start a character
  }
  for (size_t i = 1; i < length; ++i) {
    if (pos + i >= bytes.size()) return {Utf8Step::kIncomplete, i, 0};
    const uint8_t b = byte(pos + i);
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) return {Utf8Step::kInvalid, i, 0};
    c = (c << 6) | (b & 0x3F);
  }
  return {Utf8Step::kValid, length, c};
}

absl::Status ValidateUtf8(absl::string_view bytes) {
  for (size_t pos = 0; pos < bytes.size();) {
    const Utf8Step step = DecodeUtf8At(bytes, pos);
    if (step.kind != Utf8Step::kValid) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "text is not valid UTF-8: %s sequence starting with byte 0x%02X at offset %d",
          step.kind == Utf8Step::kIncomplete ? "truncated" : "ill-formed",
          static_cast<uint8_t>(bytes[pos]), pos));
    }
    pos += step.length;
  }
  return absl::OkStatus();
}

void DecodeUtf8(absl::string_view text, std::vector<char32_t>* code_points,
                std::vector<size_t>* offsets) {
  code_points->clear();
  offsets->clear();
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Step step = DecodeUtf8At(text, pos);
    code_points->push_back(step.code_point);
    offsets->push_back(pos);
    pos += step.length;
  }
  offsets->push_back(text.size());
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

size_t AppendUtf8Lossy(absl::string_view bytes, bool final, std::string* out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Utf8Step step = DecodeUtf8At(bytes, pos);
    if (step.kind == Utf8Step::kIncomplete && !final) break;
    if (step.kind == Utf8Step::kValid) {
      out->append(bytes.data() + pos, step.length);
    } else {
      out->append("\xEF\xBF\xBD");  // U+FFFD
    }
    pos += step.length;
  }
  return pos;
}

std::string Utf8Lossy(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  AppendUtf8Lossy(bytes, /*final=*/true, &out);
  return out;
}

}  // namespace moesh
