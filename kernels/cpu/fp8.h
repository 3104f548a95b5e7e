// DeepSeek's block-scaled FP8 (e4m3) on the CPU: the reference the CUDA FP8
// ops (kernels/cuda/fp8.h) are tested against.
//
// A weight w[n, k] is stored as e4m3 codes with one float32 scale per
// 128 x 128 block (the checkpoint's `weight_scale_inv`: value = code * scale);
// an activation x[m, k] is quantized on the fly with one scale per row per 128
// columns (DeepSeek's act_quant: scale = max|x| / 448 over the 128 values,
// code = e4m3(x / scale)). A block-scaled linear multiplies the codes,
// accumulates each 128-wide k block in float32, and adds the block's sum times
// both scales.
#ifndef MOESH_KERNELS_CPU_FP8_H_
#define MOESH_KERNELS_CPU_FP8_H_

#include <cstdint>

namespace moesh::cpu {

constexpr int kFp8Block = 128;
constexpr float kFp8Max = 448.0f;  // e4m3's largest finite value
// The smallest block amax a scale is taken from: an all-zero block gets a
// tiny scale, not 0.
constexpr float kFp8MinAmax = 1e-10f;
// Blocks of kFp8Block covering n.
constexpr int Fp8Blocks(int n) { return (n + kFp8Block - 1) / kFp8Block; }

// q[m, k] = e4m3(x / scale), scale[m, Fp8Blocks(k)] = max(max|x|, 1e-10) / 448
// per row and 128 columns (the last block may be narrower). ldx: x's row
// stride (0: k).
void QuantizeFp8Rows(const float* x, uint8_t* q, float* scale, int m, int k, int ldx = 0);

// The inverse: x[m, k] = e4m3(q) * scale[i, c / 128] (scales as
// QuantizeFp8Rows writes them; e.g. the FP8 expert dispatch's hidden states,
// common/transport/dispatch_wire.h).
void DequantizeFp8Rows(const uint8_t* q, const float* scale, float* x, int m, int k);

// The same with one scale per 128 x 128 block: scale[Fp8Blocks(n),
// Fp8Blocks(k)] (a weight quantized at load, `--quantization fp8`).
void QuantizeFp8Blocks(const float* w, uint8_t* q, float* scale, int n, int k);

// y[m, n] = Σ_b x_scale[i, b] · w_scale[j / 128, b] · Σ_{c in block b}
// x[i, c] · w[j, c], float32 accumulation. x, w: e4m3 codes [m, k], [n, k];
// x_scale [m, Fp8Blocks(k)], w_scale [Fp8Blocks(n), Fp8Blocks(k)].
void Fp8BlockLinear(const uint8_t* x, const float* x_scale, const uint8_t* w, const float* w_scale,
                    float* y, int m, int n, int k);

// FlashMLA's FP8 KV cache row (DeepSeek-V3.2's layout: 656 bytes a token at
// V3's 512 + 64): the latent part in e4m3 with one float32 scale per 128
// values, a power of two (UE8M0-valued: 2^ceil(log2(max(max|x|, 1e-4) /
// 448))), the rope part in bf16. Power-of-two scales make the round trip
// idempotent: rows handed over as floats and stored again come back the same.
constexpr float kFp8KvAmaxFloor = 1e-4f;
// The scale of a 128-value latent tile whose largest magnitude is `amax`.
float Fp8KvScale(float amax);

// The row's bytes in a device cache: [latent e4m3 codes | Fp8Blocks(latent)
// float32 scales | rope bf16], padded to 16 bytes (656 at 512 + 64, as
// FlashMLA's). REQUIRES: latent a positive multiple of 16, rope >= 0 even.
struct Fp8KvRowLayout {
  int latent = 0, rope = 0;
  constexpr int scales_offset() const { return latent; }
  constexpr int rope_offset() const { return latent + 4 * Fp8Blocks(latent); }
  constexpr int bytes() const { return (rope_offset() + 2 * rope + 15) / 16 * 16; }
};
static_assert(Fp8KvRowLayout{512, 64}.bytes() == 656, "FlashMLA's FP8 KV row");

// row[latent + rope] -> the layout's bytes (padding zeroed).
void PackFp8KvRow(const float* row, const Fp8KvRowLayout& layout, uint8_t* out);
// The layout's bytes -> row[latent + rope]: code * scale, and the bf16 rope.
void UnpackFp8KvRow(const uint8_t* in, const Fp8KvRowLayout& layout, float* row);
// What the FP8 cache gives back for row[latent + rope], in place (Pack then
// Unpack): each latent value e4m3(x / scale) * scale, each rope value rounded
// to bf16. Any latent width (a last group narrower than 128).
void RoundTripFp8KvRow(float* row, int latent, int rope);

}  // namespace moesh::cpu

#endif  // MOESH_KERNELS_CPU_FP8_H_
