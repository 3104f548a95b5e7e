#include "base/dtype.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/fp8_e4m3.h"

namespace moesh {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E8M0:
    case DType::kI8:
    case DType::kU8:
      return 1;
    case DType::kI64:
      return 8;
    case DType::kI32:
      return 4;
  }
  return 0;
}

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kF8E8M0:
      return "F8_E8M0";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI64, DType::kI32,
                  DType::kF8E8M0, DType::kI8, DType::kU8}) {
    if (DTypeName(t) == name) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype \"", std::string(name), "\""));
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    mag = mant ? NAN : INFINITY;
  } else {
    mag = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -mag : mag;
}

uint16_t F32ToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00u;
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < 6.103515625e-05f) {                // subnormal: units of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  uint32_t mant = static_cast<uint32_t>(std::nearbyint((m * 2.0f - 1.0f) * 1024.0f));
  uint32_t exp = static_cast<uint32_t>(e - 1 + 15);
  if (mant == 1024) {
    mant = 0;
    ++exp;
  }
  return sign | static_cast<uint16_t>((exp << 10) | mant);
}

float F8E4M3ToF32(uint8_t v) { return fp8::DecodeE4m3(v); }

uint8_t F32ToF8E4M3(float f) { return fp8::EncodeE4m3(f); }

void ConvertToF32(DType t, const void* src, size_t n, float* dst) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    // 16-bit values read byte-wise: a safetensors tensor may start at any
    // byte offset (one after an odd-sized I8/U8 tensor does).
    case DType::kBF16: {
      const unsigned char* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, s + 2 * i, sizeof(v));
        dst[i] = Bf16ToF32(v);
      }
      return;
    }
    case DType::kF16: {
      const unsigned char* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, s + 2 * i, sizeof(v));
        dst[i] = F16ToF32(v);
      }
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F8E4M3ToF32(s[i]);
      return;
    }
    case DType::kF8E8M0: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = E8M0ToF32(s[i]);
      return;
    }
    case DType::kI64:
    case DType::kI32:
    case DType::kI8:
    case DType::kU8:
      return;
  }
}

bool IsFloatDType(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF8E4M3 ||
         t == DType::kF8E8M0;
}

float E8M0ToF32(uint8_t e) {
  if (e == 0xFF) return NAN;
  return std::ldexp(1.0f, static_cast<int>(e) - 127);
}

}  // namespace moesh
