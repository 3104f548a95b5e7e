#include "common/cuda_backend/layer_stack.h"

#include "common/cuda_backend/mla_layer_stack.h"
#include "common/cuda_backend/v4_layer_stack.h"

namespace moesh::cuda {

absl::StatusOr<std::unique_ptr<LayerStack>> MakeLayerStack(const ForwardContext& ctx,
                                                           FfnBlock* ffn) {
  if (ctx.config.layers() == LayerArch::kV4) return V4LayerStack::Create(ctx, ffn);
  return MlaLayerStack::Create(ctx, ffn);
}

}  // namespace moesh::cuda
