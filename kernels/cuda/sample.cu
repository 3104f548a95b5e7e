// Sampling one token per row of logits (routing.h RunSample): one CTA of
// 1024 threads per row, Sampler::SampleWithDraw's definition without a sort.
//
// Every cut SampleWithDraw makes (top-k, top-p, min-p, and the draw itself)
// keeps a prefix of the candidate order "logit descending, id ascending", so
// each is one position in that order, a Cut. A position is found by a radix
// select over the logits' order-preserving 32-bit keys: three histogram
// passes (11, 11 and 10 bits of the key) of a weight — 1 for top-k, the
// probability mass expf(x - max) for top-p and the draw — and, only where the
// position falls after the first of several equal logits, one pass over them
// in id order. Min-p's cut is a key found by bisection, without a pass.
// Masses are 24.40 fixed point in 64-bit integers: sums are exact and
// independent of the order of the atomics, so a seeded request samples the
// same token on every run. A row costs 1 + 3 passes per cut (top-k, top-p,
// the draw) over its logits.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/routing.h"

namespace moesh::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;  // 11 bits
constexpr int kUnroll = 8;   // loads in flight per thread in a pass
constexpr unsigned kFull = 0xffffffffu;
constexpr double kFixedOne = 1099511627776.0;  // 2^40
constexpr int kMaxVocab = 1 << 22;             // vocab * 2^40 < 2^63

// Order-preserving: a > b as floats iff Key(a) > Key(b) as integers, and
// a == b iff Key(a) == Key(b) (-0 is +0).
__device__ __forceinline__ uint32_t Key(float x) {
  const uint32_t u = x == 0.0f ? 0u : __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float KeyValue(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// A position in the candidate order; the candidates kept are those at or
// before it. {0, INT_MAX} keeps every finite or infinite logit.
struct Cut {
  uint32_t key;
  int id;
};
__device__ __forceinline__ bool Kept(uint32_t key, int id, Cut c) {
  return key > c.key || (key == c.key && id <= c.id);
}

__device__ __forceinline__ unsigned long long Mass(float x, float xmax) {
  return __float2ull_rz(expf(x - xmax) * static_cast<float>(kFixedOne));
}

struct Shared {
  unsigned long long hist[kBins];
  uint32_t min_id[kBins / 2];  // the last pass: the lowest kept id per exact key
  float redf[kWarps];
  int redi[kWarps];
  int sel_bin;
  unsigned long long sel_above, sel_target;
  int sel_id;
};

// The best (v, i) over the block, lowest i on ties; every thread gets it.
__device__ __forceinline__ void ArgMax(float& v, int& i, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  WarpArgBest(v, i);
  __syncthreads();
  if (lane == 0) {
    sh.redf[warp] = v;
    sh.redi[warp] = i;
  }
  __syncthreads();
  v = sh.redf[lane];
  i = sh.redi[lane];
  WarpArgBest(v, i);
}

// The exclusive prefix sum of v over the threads in order.
__device__ __forceinline__ int BlockExclusiveScan(int v, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += t;
  }
  __syncthreads();
  if (lane == 31) sh.redi[warp] = incl;
  __syncthreads();
  int offset = 0;
  for (int w = 0; w < warp; ++w) offset += sh.redi[w];
  return offset + incl - v;
}

// The id of the r-th (1-based) kept logit, in id order, whose key is `key`
// (one pass in id order: each thread a contiguous chunk).
__device__ int TieId(const float* row, int vocab, Cut within, uint32_t key, unsigned long long r,
                     Shared& sh) {
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int lo = min(vocab, static_cast<int>(threadIdx.x) * chunk), hi = min(vocab, lo + chunk);
  if (threadIdx.x == 0) sh.sel_id = -1;  // ordered before the reads by the scan's barriers
  int count = 0;
  for (int i = lo; i < hi; ++i) {
    const uint32_t k = Key(row[i]);
    count += k == key && Kept(k, i, within);
  }
  const int before = BlockExclusiveScan(count, sh);
  if (before < static_cast<long long>(r) && before + count >= static_cast<long long>(r)) {
    int need = static_cast<int>(r) - before;
    for (int i = lo; i < hi; ++i) {
      const uint32_t k = Key(row[i]);
      if (k == key && Kept(k, i, within) && --need == 0) {
        sh.sel_id = i;
        break;
      }
    }
  }
  __syncthreads();
  const int id = sh.sel_id;
  __syncthreads();
  return id;
}

// What Select looks for, given the kept weight `total`: the first position
// where the cumulative weight reaches `count` (kCount: weight 1 per logit),
// reaches ceil(value * total) (kFraction), or exceeds value * total (kDraw).
struct Target {
  enum Kind { kCount, kFraction, kDraw } kind;
  unsigned long long count;
  double value;
};
__device__ __forceinline__ unsigned long long Resolve(const Target& t, unsigned long long total) {
  unsigned long long v = t.count;
  if (t.kind == Target::kFraction)
    v = static_cast<unsigned long long>(ceil(t.value * static_cast<double>(total)));
  if (t.kind == Target::kDraw)
    v = static_cast<unsigned long long>(t.value * static_cast<double>(total)) + 1;
  return min(max(v, 1ull), total);
}

// The position Target names among the kept logits in candidate order: a
// radix select over the keys (bits 31-21, 20-10, 9-0), each pass a histogram
// of the kept weight (count or Mass) among the logits matching the key bits
// chosen so far; the first pass's total resolves the target. The last pass
// also keeps the lowest id per key, so a position at the first of its ties
// needs no further pass.
template <bool kCount>
__device__ Cut Select(const float* row, int vocab, Cut within, Target want, float xmax,
                      Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;  // weight kept above the prefix's range of keys
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
    const int bins = pass == 2 ? 1024 : 2048;
    for (int b = threadIdx.x; b < bins; b += kThreads) {
      sh.hist[b] = 0;
      if (pass == 2) sh.min_id[b] = UINT_MAX;
    }
    __syncthreads();
    // kUnroll independent loads in flight per thread, then their bins.
    for (int base = 0; base < vocab; base += kThreads * kUnroll) {
      float xs[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads + threadIdx.x;
        xs[u] = i < vocab ? row[i] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads + threadIdx.x;
        const float x = xs[u];
        const uint32_t k = Key(x);
        // Masses below 2^-40 of the best are 0 in fixed point: such logits cannot be chosen.
        const bool take = i < vocab && (kCount || x - xmax >= -28.0f) && (k & mask) == prefix &&
                          Kept(k, i, within);
        const uint32_t digit = (k >> shift) & (bins - 1);
        const unsigned active = __ballot_sync(kFull, take);
        if (!take) continue;
        // One atomic per distinct bin of the warp.
        const unsigned peers = __match_any_sync(active, digit);
        const bool leader = lane == __ffs(peers) - 1;
        unsigned long long w;
        if constexpr (kCount) {
          w = __popc(peers);
        } else {
          const unsigned long long mine = Mass(x, xmax);
          w = 0;
          for (unsigned rest = peers; rest != 0; rest &= rest - 1)
            w += __shfl_sync(peers, mine, __ffs(rest) - 1);
        }
        if (leader && w != 0) atomicAdd(&sh.hist[digit], w);
        if (pass == 2) {
          const unsigned lowest = __reduce_min_sync(peers, static_cast<unsigned>(i));
          if (leader) atomicMin(&sh.min_id[digit], lowest);
        }
      }
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l sums bins top_l, top_l - 1, ... (lane 0 the highest keys).
      const int per = bins / 32, top = bins - 1 - lane * per;
      unsigned long long s = 0;
      for (int j = 0; j < per; ++j) s += sh.hist[top - j];
      unsigned long long incl = s;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long t = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += t;
      }
      const unsigned long long target =
          pass == 0 ? Resolve(want, __shfl_sync(kFull, incl, 31)) : sh.sel_target;
      const unsigned hit = __ballot_sync(kFull, above + incl >= target);
      // No hit: nothing kept (impossible: the best logit always is); the last lane takes the lowest
      // bin.
      if (lane == (hit != 0 ? __ffs(hit) - 1 : 31)) {
        unsigned long long acc = above + incl - s;
        int b = top;
        for (int j = 0; j + 1 < per && acc + sh.hist[b] < target; ++j, --b) acc += sh.hist[b];
        sh.sel_bin = b;
        sh.sel_above = acc;
        sh.sel_target = target;
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sh.sel_bin) << shift;
    mask |= static_cast<uint32_t>(bins - 1) << shift;
    above = sh.sel_above;
    __syncthreads();
  }
  // Every kept logit of key `prefix` weighs the same: the position is the
  // r-th of them in id order.
  const unsigned long long target = sh.sel_target;
  const int lowest = static_cast<int>(sh.min_id[prefix & 1023]);
  const unsigned long long each = kCount ? 1ull : max(Mass(KeyValue(prefix), xmax), 1ull);
  const unsigned long long r = target > above ? (target - above + each - 1) / each : 1;
  __syncthreads();  // every thread has read sh.sel_target and sh.min_id
  return Cut{prefix, r == 1 ? lowest : TieId(row, vocab, within, prefix, r, sh)};
}

// The smallest key whose logit x has expf(x - xmax) >= min_p: min-p's cut,
// found by bisection over the keys (the predicate is monotone; xmax's own
// key satisfies it).
__device__ uint32_t MinPKey(float xmax, float min_p) {
  uint32_t lo = 0, hi = Key(xmax);
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (expf(KeyValue(mid) - xmax) >= min_p) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return hi;
}

__global__ void __launch_bounds__(kThreads, 1) SampleKernel(SampleParams p) {
  PdlBegin();
  __shared__ Shared sh;
  const int b = blockIdx.x;
  const SampleRow r = p.rows[b];
  float* row = p.logits + static_cast<int64_t>(b) * p.ld;
  const int vocab = p.vocab;

  // Penalties: one thread per entry (distinct tokens), as the CPU rounds them.
  for (int e = r.penalty_begin + threadIdx.x; e < r.penalty_end; e += kThreads) {
    const PenaltyEntry pe = p.penalties[e];
    float x = row[pe.id];
    if (r.repetition_penalty != 1.0f) {
      x = x > 0.0f ? __fdiv_rn(x, r.repetition_penalty) : __fmul_rn(x, r.repetition_penalty);
    }
    if (pe.output_count > 0 && (r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f)) {
      x = __fsub_rn(x,
                    __fadd_rn(r.presence_penalty,
                              __fmul_rn(r.frequency_penalty, static_cast<float>(pe.output_count))));
    }
    row[pe.id] = x;
  }
  __syncthreads();

  // logits / temperature in place, and the best (lowest id on ties; a thread
  // with no logits offers (-inf, INT_MAX), which loses every tie).
  float best = -INFINITY;
  int best_id = INT_MAX;
  for (int base = 0; base < vocab; base += kThreads * kUnroll) {
    float xs[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kThreads + threadIdx.x;
      xs[u] = i < vocab ? row[i] : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kThreads + threadIdx.x;
      if (i >= vocab) break;
      float x = xs[u];
      if (r.temperature >= sampling::kMinTemperature) {
        x = __fdiv_rn(x, r.temperature);
        if (isnan(x)) x = -INFINITY;  // NaN counts as -inf
        row[i] = x;
      }
      if (Better(x, i, best, best_id)) {
        best = x;
        best_id = i;
      }
    }
  }
  ArgMax(best, best_id, sh);
  if (best_id == INT_MAX) best_id = 0;  // every logit NaN
  // Greedy, or no finite best (+inf, or -inf everywhere): the best candidate.
  if (r.temperature < sampling::kMinTemperature || !isfinite(best)) {
    if (threadIdx.x == 0) p.ids[b] = best_id;
    return;
  }
  const float xmax = best;
  Cut cut{0u, INT_MAX};
  if (r.top_k > 0 && r.top_k < vocab) {
    cut = Select<true>(row, vocab, cut,
                       Target{Target::kCount, static_cast<unsigned long long>(r.top_k), 0.0}, xmax,
                       sh);
  }
  if (r.top_p < 1.0f)
    cut = Select<false>(row, vocab, cut, Target{Target::kFraction, 0, r.top_p}, xmax, sh);
  if (r.min_p > 0.0f) {
    const uint32_t k = MinPKey(xmax, r.min_p);  // keeps the keys >= k
    if (k > cut.key) cut = Cut{k, INT_MAX};
  }
  cut = Select<false>(row, vocab, cut, Target{Target::kDraw, 0, r.draw}, xmax, sh);
  if (threadIdx.x == 0) p.ids[b] = cut.id;
}

}  // namespace

absl::Status RunSample(const SampleParams& p) {
  const int ld = p.ld ? p.ld : p.vocab;
  if (p.batch < 0 || p.vocab < 1 || p.vocab > kMaxVocab || ld < p.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunSample: need batch >= 0, 1 <= vocab <= ", kMaxVocab, ", ld >= vocab"));
  }
  if (p.batch == 0) return absl::OkStatus();
  if (p.logits == nullptr || p.rows == nullptr || p.ids == nullptr) {
    return absl::InvalidArgumentError("RunSample: null pointer");
  }
  SampleParams q = p;
  q.ld = ld;
  RETURN_IF_ERROR(LaunchPdl("SampleKernel", SampleKernel, p.batch, kThreads, 0, p.stream, q));
  return LaunchStatus("SampleKernel");
}

}  // namespace moesh::cuda
