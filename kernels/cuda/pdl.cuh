// Programmatic dependent launch (Hopper): a kernel launched by LaunchPdl may
// begin while the kernel before it in its stream (or graph) is still
// running, so its CTAs are resident and past their launch when that kernel
// ends. The contract of a kernel launched so:
//   * PdlWait() comes before its first access (read or write) of any memory
//     another kernel of the step reads or writes. Before it, only what no
//     earlier kernel writes: weights, the kernel's params, shared memory,
//     and L2 prefetches of weights (BulkPrefetchL2, async_copy.cuh).
//   * Every CTA calls PdlWait() before it exits, early returns included: a
//     later kernel's plain launch (a graph edge) waits for this kernel only,
//     so this kernel may not end before the one it overlaps.
//   * PdlWait() returns when every kernel it may overlap has completed and
//     its writes are visible (griddepcontrol.wait), so a kernel that waits
//     depends on all of the stream's earlier work, as a plain launch does.
// PdlLaunchDependents() (griddepcontrol.launch_dependents) lets the next
// programmatic launch's CTAs start once every CTA of this kernel has called
// it or exited; it changes when they start, never what they may read. Both
// are no-ops in a kernel launched without the attribute.
#ifndef MOESH_KERNELS_CUDA_PDL_CUH_
#define MOESH_KERNELS_CUDA_PDL_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/pdl.h"

// griddepcontrol is sm_90's: a kernel built for an older target would be
// launched with the attribute and run without its wait.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "pdl.cuh: kernels launched by LaunchPdl need sm_90 or later (griddepcontrol)"
#endif

namespace moesh::cuda {

__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void PdlLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The first statement of a kernel that reads nothing before its wait. The
// next kernel's CTAs may start once every CTA here is past its wait: one
// kernel ahead at most (a trigger before the wait would let every later
// kernel's CTAs pile up on the SMs behind a long one).
__device__ __forceinline__ void PdlBegin() {
  PdlWait();
  PdlLaunchDependents();
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic
// stream serialization attribute where ProgrammaticLaunch() (pdl.h) is on;
// LaunchPdlCluster: the CTAs in clusters of `cluster` too. Only for kernels
// that keep the contract above.
template <typename... KArgs, typename... Args>
absl::Status LaunchPdlCluster(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                              size_t smem, cudaStream_t stream, dim3 cluster, Args&&... args) {
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (ProgrammaticLaunch()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x, attr[n].val.clusterDim.y = cluster.y;
    attr[n++].val.clusterDim.z = cluster.z;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr, config.numAttrs = n;
  return CudaStatus(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), name);
}

template <typename... KArgs, typename... Args>
absl::Status LaunchPdl(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                       size_t smem, cudaStream_t stream, Args&&... args) {
  return LaunchPdlCluster(name, kernel, grid, block, smem, stream, dim3(1, 1, 1),
                          std::forward<Args>(args)...);
}

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_PDL_CUH_
