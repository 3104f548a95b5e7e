// What the CUDA benchmarks (kernel_bench, cuda_model_bench) share: an
// event-timed median, random routing, and the device's ceilings every result is compared
// with (device-to-device copy bandwidth, bf16 GEMM rate), measured in the
// same run.
#ifndef MOESH_TOOLS_BENCH_BENCH_UTIL_H_
#define MOESH_TOOLS_BENCH_BENCH_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/random_topk.h"  // UniformTopkIds, for the benches

namespace moesh::cuda {

struct Ceilings {
  double copy_gbps = 0;    // bytes read + written per second / 1e9
  double gemm_tflops = 0;  // 8192^3 bf16
};

// Median over `reps` event-timed runs of fn(call) after `warmup` untimed
// ones, in milliseconds: for large measurements, where launch costs vanish.
// (A D2D copy inside a graph runs on a copy engine at about two thirds of
// the rate measured this way.)
template <typename Fn>
absl::StatusOr<double> EventMedianMs(cudaStream_t stream, int warmup, int reps, Fn fn) {
  for (int i = 0; i < warmup; ++i) RETURN_IF_ERROR(fn(i));
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; ++i) {
    ASSIGN_OR_RETURN(Event a, Event::Create());
    ASSIGN_OR_RETURN(Event b, Event::Create());
    RETURN_IF_ERROR(a.Record(stream));
    RETURN_IF_ERROR(fn(warmup + i));
    RETURN_IF_ERROR(b.Record(stream));
    ASSIGN_OR_RETURN(float t, b.ElapsedMsSince(a));
    ms[i] = t;
  }
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[reps / 2];
}

// Median over `reps` event-timed replays of a CUDA graph holding `inner`
// calls fn(call), in milliseconds per call: GPU time, without the host's
// launch costs (decode runs as graphs). Warm-up calls run outside the graph.
template <typename Fn>
absl::StatusOr<double> MedianMs(cudaStream_t stream, int warmup, int reps, Fn fn, int inner = 1) {
  int call = 0;
  for (; call < warmup; ++call) RETURN_IF_ERROR(fn(call));
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  absl::Status captured = absl::OkStatus();
  for (int j = 0; j < inner && captured.ok(); ++j) captured = fn(call++);
  cudaGraph_t graph = nullptr;
  RETURN_IF_CUDA_ERROR(cudaStreamEndCapture(stream, &graph));
  RETURN_IF_ERROR(captured);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  RETURN_IF_CUDA_ERROR(inst);
  std::vector<Event> starts, stops;
  absl::Status st = absl::OkStatus();
  for (int i = 0; i < reps && st.ok(); ++i) {
    auto a = Event::Create();
    auto b = Event::Create();
    if (!a.ok() || !b.ok()) {
      st = a.ok() ? b.status() : a.status();
      break;
    }
    starts.push_back(*std::move(a));
    stops.push_back(*std::move(b));
  }
  for (int i = 0; i < reps && st.ok(); ++i) {
    st = starts[i].Record(stream);
    if (st.ok()) st = CudaStatus(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    if (st.ok()) st = stops[i].Record(stream);
  }
  std::vector<double> ms(reps);
  for (int i = 0; i < reps && st.ok(); ++i) {
    auto t = stops[i].ElapsedMsSince(starts[i]);
    if (!t.ok()) {
      st = t.status();
    } else {
      ms[i] = *t / inner;
    }
  }
  cudaGraphExecDestroy(exec);
  RETURN_IF_ERROR(st);
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[reps / 2];
}

// Calls a timed graph holds in kernel_bench's tables.
inline constexpr int kInner = 20;

// A 2 GiB device-to-device copy and an 8192^3 bf16 GEMM through `gemm`.
absl::StatusOr<Ceilings> MeasureCeilings(CublasGemm& gemm, cudaStream_t stream);

}  // namespace moesh::cuda

#endif  // MOESH_TOOLS_BENCH_BENCH_UTIL_H_
