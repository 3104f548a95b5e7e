// MakeLayerStack (layer_stack.h): the families' stacks by layer architecture, in a file of its
// own so that the interface does not depend on its implementations.
#include "base/status.h"
#include "common/cuda_backend/layer_stack.h"
#include "common/cuda_backend/mla/mla_layer_stack.h"
#include "common/cuda_backend/v4/v4_layer_stack.h"

namespace moesh::cuda {

absl::StatusOr<std::unique_ptr<LayerStack>> MakeLayerStack(const ForwardContext& ctx,
                                                           FfnBlock* ffn) {
  std::unique_ptr<LayerStack> stack;
  switch (ctx.config.layers()) {
    case LayerArch::kMla:
      stack = std::make_unique<MlaLayerStack>(ctx, ffn);
      break;
    case LayerArch::kV4:
      stack = std::make_unique<V4LayerStack>(ctx, ffn);
      break;
  }
  if (stack == nullptr) return absl::InternalError("MakeLayerStack: no stack for this family");
  RETURN_IF_ERROR(stack->Init());
  return stack;
}

}  // namespace moesh::cuda
