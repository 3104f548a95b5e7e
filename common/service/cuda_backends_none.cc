// backends.h's CUDA factories in a build without the CUDA backend.
#include "common/service/backends.h"

namespace moesh {
namespace {

absl::Status NoCuda(const std::string& device) {
  return absl::FailedPreconditionError("--device " + device +
                                       ": this moesh was built without the CUDA backend (build with nvcc on the "
                                       "PATH and -DMOESH_CUDA=ON, or use the moesh-cuda image)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionBackend>> MakeCudaAttentionBackend(const ModelConfig&, const Checkpoint&,
                                                                           const DeviceOptions& options, bool) {
  return NoCuda(options.device);
}

absl::StatusOr<std::unique_ptr<ExpertStage>> MakeCudaExpertStage(const ModelConfig&,
                                                                 std::unique_ptr<ExpertShardWeights>,
                                                                 const DeviceOptions& options) {
  return NoCuda(options.device);
}

}  // namespace moesh
