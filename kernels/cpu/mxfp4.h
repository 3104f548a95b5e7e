// MXFP4 (OCP Microscaling FP4) as DeepSeek-V4 ships its routed experts: a
// weight w[n, k] is stored as e2m1 codes, two per byte, [n, k / 2] (element
// 2i in the low nibble, 2i + 1 in the high one), and one ue8m0 scale per 32
// consecutive inputs, [n, k / 32]: value = e2m1(code) * 2^(scale - 127).
//
// e2m1: sign bit 3, then 2 exponent and 1 mantissa bits; magnitudes 0, 0.5,
// 1, 1.5, 2, 3, 4, 6. It has no infinity and no NaN; a block whose scale is
// 0xFF (ue8m0's NaN) decodes to NaN, which is how MX marks a block holding a
// non-finite value. The CPU engine dequantizes with these (exactly: every
// value is a small integer times a power of two).
//
// Thread-safe: pure functions.
#ifndef MOESH_KERNELS_CPU_MXFP4_H_
#define MOESH_KERNELS_CPU_MXFP4_H_

#include <cstdint>

namespace moesh::cpu {

constexpr int kMxfp4Block = 32;  // inputs per ue8m0 scale
constexpr float kE2M1Max = 6.0f;
constexpr uint8_t kE8M0Nan = 0xFF;

// The value of the e2m1 code in the low 4 bits of `code`.
float E2M1ToF32(uint8_t code);
// The nearest e2m1 code (ties to the even code), saturating at ±6; NaN
// gives +0 (e2m1 cannot hold it: the block's scale carries it).
uint8_t F32ToE2M1(float x);
// The smallest ue8m0 exponent e with amax / 2^(e-127) <= 6, clamped to
// [0, 254] (values beyond 6 * 2^127 saturate); 127 (scale 1) for amax 0;
// kE8M0Nan for a non-finite amax.
uint8_t Mxfp4ScaleFor(float amax);

// w[n, k] -> packed[n, k / 2], scale[n, k / 32]. REQUIRES: k % 32 == 0.
void QuantizeMxfp4(const float* w, uint8_t* packed, uint8_t* scale, int n, int k);
// The inverse: w[n, k] from packed[n, k / 2] and scale[n, k / 32].
void DequantizeMxfp4(const uint8_t* packed, const uint8_t* scale, float* w, int n, int k);

}  // namespace moesh::cpu

#endif  // MOESH_KERNELS_CPU_MXFP4_H_
