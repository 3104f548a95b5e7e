// The wgmma wrappers and SW128 descriptors (wgmma.cuh) against a host GEMM,
// in the three forms the wide MLA decode kernel uses: S = Q · K^T with both
// operands K-major (m64n64k16), and O = P · V with V MN-major (m64n256k16,
// kTransB = 1) with P from shared memory and from registers, and the MLA
// prefill's m64n128k16 with A from registers (its P · V). A wrong
// descriptor field or fragment layout shows up here, named, before it shows
// up as a wrong attention output.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "kernels/cuda/wgmma.cuh"

namespace moesh::cuda {
namespace {

constexpr int kM = 64, kK = 64, kN1 = 64, kN2 = 256, kN4 = 128;
constexpr int kBlock = 64 * 128;  // one SW128 column block of 64 rows

// smem: A [64 x 64] K-major | B1 [64 x 64] K-major | B2 [64 (K) x 256 (N)]
// MN-major as four column blocks. out1 [64 x 64], out2 and out3 [64 x 256]
// fp32 (out3: A from registers, read from `a` [64 x 64] bf16 row-major),
// out4 [64 x 128] (A from registers, B2's first two column blocks).
__global__ void ProbeKernel(const uint8_t* image, int image_bytes, const bf16* a_rows,
                            uint32_t lead, uint32_t stride, float* out1, float* out2, float* out3,
                            float* out4) {
  extern __shared__ uint8_t raw[];
  uint8_t* s =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  for (int i = threadIdx.x * 16; i < image_bytes; i += blockDim.x * 16) {
    *reinterpret_cast<uint4*>(s + i) = *reinterpret_cast<const uint4*>(image + i);
  }
  wgmma::FenceProxyAsync();
  __syncthreads();
  const uint8_t *a = s, *b1 = s + kBlock, *b2 = s + 2 * kBlock;
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, tq = threadIdx.x % 4;
  // This thread's A fragments (mma.m16n8k16's) per k step.
  uint32_t af[kK / 16][4];
  for (int kk = 0; kk < kK / 16; ++kk) {
    for (int r = 0; r < 4; ++r) {
      const int row = warp * 16 + g + (r % 2) * 8, col = kk * 16 + (r / 2) * 8 + 2 * tq;
      af[kk][r] = *reinterpret_cast<const uint32_t*>(a_rows + row * kK + col);
    }
  }
  float d1[kN1 / 2], d2[kN2 / 2], d3[kN2 / 2], d4[kN4 / 2];
  for (float& v : d1) v = 0.0f;
  for (float& v : d2) v = 0.0f;
  for (float& v : d3) v = 0.0f;
  for (float& v : d4) v = 0.0f;
  wgmma::FenceOperands(d1);
  wgmma::FenceOperands(d2);
  wgmma::FenceOperands(d3);
  wgmma::FenceOperands(d4);
  wgmma::Fence();
  for (int kk = 0; kk < kK / 16; ++kk) {
    wgmma::WgmmaM64N64K16<0>(d1, wgmma::DescKMajor(a + kk * 32), wgmma::DescKMajor(b1 + kk * 32),
                             1);
    wgmma::WgmmaM64N256K16<1>(d2, wgmma::DescKMajor(a + kk * 32),
                              wgmma::Desc(b2 + kk * 16 * 128, lead, stride), 1);
    wgmma::WgmmaM64N256K16Rs<1>(d3, af[kk], wgmma::Desc(b2 + kk * 16 * 128, lead, stride), 1);
    wgmma::WgmmaM64N128K16Rs<1>(d4, af[kk], wgmma::Desc(b2 + kk * 16 * 128, lead, stride), 1);
  }
  wgmma::Commit();
  wgmma::Wait<0>();
  wgmma::FenceOperands(d1);
  wgmma::FenceOperands(d2);
  wgmma::FenceOperands(d3);
  wgmma::FenceOperands(d4);
  for (int j = 0; j < kN1 / 8; ++j) {
    for (int r = 0; r < 4; ++r) {
      out1[(warp * 16 + g + (r / 2) * 8) * kN1 + j * 8 + 2 * tq + r % 2] = d1[4 * j + r];
    }
  }
  for (int j = 0; j < kN2 / 8; ++j) {
    for (int r = 0; r < 4; ++r) {
      out2[(warp * 16 + g + (r / 2) * 8) * kN2 + j * 8 + 2 * tq + r % 2] = d2[4 * j + r];
      out3[(warp * 16 + g + (r / 2) * 8) * kN2 + j * 8 + 2 * tq + r % 2] = d3[4 * j + r];
    }
  }
  for (int j = 0; j < kN4 / 8; ++j) {
    for (int r = 0; r < 4; ++r) {
      out4[(warp * 16 + g + (r / 2) * 8) * kN4 + j * 8 + 2 * tq + r % 2] = d4[4 * j + r];
    }
  }
}

// Writes `m` [rows x 64-wide blocks of cols] into SW128 column blocks at dst.
void Store(const std::vector<float>& m, int rows, int cols, uint8_t* dst) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const bf16 v = __float2bfloat16(m[static_cast<size_t>(r) * cols + c]);
      std::memcpy(dst + (c / 64) * rows * 128 + wgmma::Swizzle128Offset(r, c % 64), &v, 2);
    }
  }
}

struct Result {
  double err1, err2, err3, err4;
};

Result RunProbe(uint32_t lead, uint32_t stride, const std::vector<float>& a,
                const std::vector<float>& b1, const std::vector<float>& b2) {
  std::vector<uint8_t> image(6 * kBlock, 0);
  Store(a, kM, kK, image.data());
  Store(b1, kN1, kK, image.data() + kBlock);      // [N, K]: K-major
  Store(b2, kK, kN2, image.data() + 2 * kBlock);  // [K, N]: MN-major
  std::vector<bf16> a_rows(a.size());
  for (size_t i = 0; i < a.size(); ++i) a_rows[i] = __float2bfloat16(a[i]);
  uint8_t* dimage = nullptr;
  bf16* da = nullptr;
  float *d1 = nullptr, *d2 = nullptr, *d3 = nullptr, *d4 = nullptr;
  EXPECT_EQ(cudaMalloc(&dimage, image.size()), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&da, a_rows.size() * sizeof(bf16)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d1, kM * kN1 * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d2, kM * kN2 * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d3, kM * kN2 * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d4, kM * kN4 * sizeof(float)), cudaSuccess);
  cudaMemcpy(dimage, image.data(), image.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(da, a_rows.data(), a_rows.size() * sizeof(bf16), cudaMemcpyHostToDevice);
  const int smem = static_cast<int>(image.size()) + 1024;
  cudaFuncSetAttribute(ProbeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  ProbeKernel<<<1, 128, smem>>>(dimage, static_cast<int>(image.size()), da, lead, stride, d1, d2,
                                d3, d4);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> o1(kM * kN1), o2(kM * kN2), o3(kM * kN2), o4(kM * kN4);
  cudaMemcpy(o1.data(), d1, o1.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(o2.data(), d2, o2.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(o3.data(), d3, o3.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(o4.data(), d4, o4.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dimage), cudaFree(da), cudaFree(d1), cudaFree(d2), cudaFree(d3), cudaFree(d4);
  std::vector<float> r1(kM * kN1, 0.0f), r2(kM * kN2, 0.0f);
  for (int m = 0; m < kM; ++m) {
    for (int k = 0; k < kK; ++k) {
      for (int n = 0; n < kN1; ++n) r1[m * kN1 + n] += a[m * kK + k] * b1[n * kK + k];
      for (int n = 0; n < kN2; ++n) r2[m * kN2 + n] += a[m * kK + k] * b2[k * kN2 + n];
    }
  }
  std::vector<float> r4(kM * kN4);
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN4; ++n) r4[m * kN4 + n] = r2[m * kN2 + n];
  }
  return {testing::RelErr(o1, r1), testing::RelErr(o2, r2), testing::RelErr(o3, r2),
          testing::RelErr(o4, r4)};
}

TEST(WgmmaTest, KMajorAndMnMajorSw128MatchHostGemm) {
  MOESH_REQUIRE_GPU();
  std::mt19937 rng(7);
  // bf16-exact inputs so the only error is fp32 summation order.
  auto small = [&](size_t n) {
    std::vector<float> v(n);
    std::uniform_int_distribution<int> d(-8, 8);
    for (float& x : v) x = d(rng) / 8.0f;
    return v;
  };
  const std::vector<float> a = small(kM * kK), b1 = small(kN1 * kK), b2 = small(kK * kN2);
  const Result r = RunProbe(kBlock, 1024, a, b1, b2);
  EXPECT_LE(r.err1, 1e-6) << "K-major A and B (m64n64k16): DescKMajor is wrong";
  EXPECT_LE(r.err2, 1e-6) << "MN-major B (m64n256k16, trans-b): DescMnMajor is wrong";
  EXPECT_LE(r.err3, 1e-6) << "A from registers (m64n256k16): the fragment layout is wrong";
  EXPECT_LE(r.err4, 1e-6) << "A from registers (m64n128k16): WgmmaM64N128K16Rs is wrong";
  if (r.err2 > 1e-6) {  // name the layout the hardware wanted
    const Result swapped = RunProbe(1024, kBlock, a, b1, b2);
    std::printf("  MN-major with lead 1024, stride %d: rel err %.3g\n", kBlock, swapped.err2);
  }
}

}  // namespace
}  // namespace moesh::cuda
