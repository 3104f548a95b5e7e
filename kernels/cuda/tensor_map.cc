#include "kernels/cuda/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/cuda/cuda_status.h"

namespace moesh::cuda {
namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point.
absl::StatusOr<PFN_cuTensorMapEncodeTiled_v12000> EncodeTiledFn() {
  static const absl::StatusOr<PFN_cuTensorMapEncodeTiled_v12000> fn =
      DriverEntryPoint<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
  return fn;
}

}  // namespace

absl::StatusOr<CUtensorMap> Bf16BoxMap64(const void* base, uint64_t rows, uint64_t cols,
                                         uint64_t ld, absl::string_view what) {
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0 || ld % 8 != 0 || ld < cols ||
      rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor map over ", what,
                     ": need a 16-byte aligned base, rows and cols >= 1, a row "
                     "stride of whole 16 bytes >= cols (rows ",
                     rows, ", cols ", cols, ", stride ", ld, ")"));
  }
  ASSIGN_OR_RETURN(auto encode, EncodeTiledFn());
  CUtensorMap map;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {ld * 2};  // bytes between rows
  const cuuint32_t box[2] = {64, 64};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled over ", what, ": error ", r));
  }
  return map;
}

}  // namespace moesh::cuda
