// Asynchronous copies into shared memory. Hopper's bulk copies and the
// mbarriers they complete on: one thread arms a barrier with the bytes it
// expects (MbarArriveExpectTx), issues bulk copies (a contiguous range, or a
// tile of a tensor through a CUtensorMap made on the host), and every
// consumer waits on the barrier's phase parity (MbarWait). And the per-thread
// 16-byte cp.async with its commit/wait groups (CpAsync16); named barriers.
#ifndef MOESH_KERNELS_CUDA_ASYNC_COPY_CUH_
#define MOESH_KERNELS_CUDA_ASYNC_COPY_CUH_

#include <cuda.h>

#include <cstdint>

#include "kernels/cuda/mma.cuh"

namespace moesh::cuda {

__device__ __forceinline__ void MbarInit(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count)
               : "memory");
}

// Makes the initialized barriers visible to the async proxy (the copies).
__device__ __forceinline__ void FenceMbarInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}

// One arrival (a consumer releasing a stage), no transaction bytes.
__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddr(bar)) : "memory");
}

__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, "
        "1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// `bytes` (a multiple of 16) from global `src` to shared `dst`, both 16-byte aligned.
__device__ __forceinline__ void BulkCopyG2S(void* dst, const void* src, uint32_t bytes,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}

// `bytes` (a multiple of 16) of global memory from `src` (16-byte aligned)
// into L2, asynchronously, tracked by nothing: a hint that later loads there
// find the lines in L2.
__device__ __forceinline__ void BulkPrefetchL2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// The box of a 2-D tensor map at (x = inner coordinate, y = outer) into
// shared `dst` (aligned as the map's swizzle requires: 1024 bytes for 128B).
__device__ __forceinline__ void TmaLoad2D(void* dst, const CUtensorMap* map, int x, int y,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(SmemAddr(bar))
      : "memory");
}

// Thread block clusters (sm_90). This CTA's rank in its cluster, the
// cluster's index in the grid and the clusters in the grid (x only).
__device__ __forceinline__ uint32_t ClusterCtaRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t ClusterIdX() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t NumClustersX() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}

// Named barrier `id` (1..15; 0 is __syncthreads) of `threads` threads (a
// multiple of 32), the non-.aligned forms (a warp may reach them diverged):
// BarSync waits for all of them, BarArrive counts without waiting.
__device__ __forceinline__ void BarSync(int id, int threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void BarArrive(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Every thread of every CTA of the cluster meets here (warp-convergent: each
// warp's threads all call it), with release/acquire ordering of what they
// wrote to each other's shared memory.
__device__ __forceinline__ void ClusterSync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

// The shared::cluster address of `p`'s offset (in this CTA's shared memory)
// in cluster CTA `cta`'s shared memory.
__device__ __forceinline__ uint32_t MapShared(const void* p, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(SmemAddr(p)), "r"(cta));
  return remote;
}

// One arrival on the barrier at `bar`'s offset in cluster CTA `cta`'s shared
// memory (a consumer releasing a stage its peer's copies also fill).
__device__ __forceinline__ void MbarArriveCluster(uint64_t* bar, uint32_t cta) {
  const uint32_t remote = MapShared(bar, cta);
  // The default semantics (release at CTA scope), as CUTLASS's
  // ClusterBarrier::arrive and DeepGEMM: .release.cluster compiles to
  // MEMBARs that wait for every memory operation of the thread in flight
  // (the epilogue's stores, the scale loads a slice ahead), each slice.
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

// 16 bytes into another cluster CTA's shared memory at `remote` (MapShared,
// 16-byte aligned), completing 16 transaction bytes on that CTA's barrier at
// `remote_bar` (MapShared): what its waiters on the barrier then read.
__device__ __forceinline__ void StAsync16(uint32_t remote, uint4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];" ::"r"(remote),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
      : "memory");
}

// TmaLoad2D into the same offset `dst` of every cluster CTA in `cta_mask`
// (bit i: rank i), each completing on its own barrier at `bar`'s offset.
__device__ __forceinline__ void TmaLoad2DMulticast(void* dst, const CUtensorMap* map, int x, int y,
                                                   uint64_t* bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(SmemAddr(bar)), "h"(cta_mask)
      : "memory");
}

// Ampere's per-thread asynchronous copies (cp.async, no barrier): 16 bytes
// from global `gmem` to shared `smem`, both 16-byte aligned; the destination
// is zero-filled, and nothing read, when !pred. A thread's copies since its
// last commit form a group; CpAsyncWait<N> returns once at most N of its
// groups are still in flight (then a __syncthreads() shows every thread's).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(pred ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_ASYNC_COPY_CUH_
