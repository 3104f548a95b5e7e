// Element types of checkpoint and activation tensors, and scalar conversions.
//
// Thread-safe: everything here is a pure function.
#ifndef MOESH_COMMON_BASE_DTYPE_H_
#define MOESH_COMMON_BASE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace moesh {

// kF8E8M0: OCP MX's ue8m0 scale (2^(e-127), 0xFF NaN); kI8 / kU8: raw bytes
// (DeepSeek-V4 ships MXFP4 e2m1 pairs as I8; see kernels/cpu/mxfp4.h).
enum class DType { kF32, kBF16, kF16, kF8E4M3, kI64, kI32, kF8E8M0, kI8, kU8 };

// Size of one element in bytes.
size_t DTypeSize(DType t);
// Safetensors spelling: "F32", "BF16", "F16", "F8_E4M3", "I64", "I32",
// "F8_E8M0", "I8", "U8".
std::string_view DTypeName(DType t);
// Inverse of DTypeName; INVALID_ARGUMENT for anything else (e.g. "F64").
absl::StatusOr<DType> ParseDType(std::string_view name);

inline float Bf16ToF32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round-to-nearest-even, as PyTorch does; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToF32(uint16_t v);
uint16_t F32ToF16(float f);
float F8E4M3ToF32(uint8_t v);
// ue8m0: 2^(e - 127); 0xFF is NaN (the format has no zero and no infinity).
float E8M0ToF32(uint8_t e);
// Round to nearest even, saturating at ±448 (e4m3fn has no infinities; NaN
// stays NaN): what CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
// gives.
uint8_t F32ToF8E4M3(float f);

// Whether `t` holds real numbers ConvertToF32 reads (not kI64/kI32/kI8/kU8).
bool IsFloatDType(DType t);
// Converts `n` elements of type `t` at `src` to float32 at `dst`.
// REQUIRES: IsFloatDType(t).
void ConvertToF32(DType t, const void* src, size_t n, float* dst);

}  // namespace moesh

#endif  // MOESH_COMMON_BASE_DTYPE_H_
