#include "kernels/cuda/pdl.h"

#include <atomic>

namespace moesh::cuda {
namespace {
std::atomic<bool> programmatic_launch{true};
}  // namespace

void SetProgrammaticLaunch(bool on) { programmatic_launch.store(on, std::memory_order_relaxed); }

bool ProgrammaticLaunch() { return programmatic_launch.load(std::memory_order_relaxed); }

}  // namespace moesh::cuda
