// Whether kernels that keep programmatic dependent launch's contract
// (pdl.cuh) are launched with it: process-wide, on by default (the kernels
// are built for sm_90 and later only). Off: every kernel
// waits for the one before it to end, as a plain launch (the A/B baseline:
// cuda_model_bench --pdl off).
#ifndef MOESH_KERNELS_CUDA_PDL_H_
#define MOESH_KERNELS_CUDA_PDL_H_

namespace moesh::cuda {

void SetProgrammaticLaunch(bool on);
bool ProgrammaticLaunch();

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_PDL_H_
