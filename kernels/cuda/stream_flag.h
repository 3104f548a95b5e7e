// Device-side flags between streams: a stream writes a 32-bit word in device
// memory once the work queued before it is done and visible, and another
// stream holds the work queued after a wait until a word equals a value — no
// host round trip (the driver's stream memory operations, reached through the
// runtime's driver entry point: no -lcuda). Both can be captured into a CUDA
// graph, which bakes their values in: a protocol replayed from graphs uses
// constant values, each waiter resetting the word it waited for (the test's
// ping-pong). The word may live in memory another process mapped (CUDA IPC).
//
// A wait has no timeout: a peer that never writes leaves the stream blocked,
// so a caller bounds it from the host (SyncWithin) and writes the word itself
// to release the stream when it gives up on the peer.
#ifndef MOESH_KERNELS_CUDA_STREAM_FLAG_H_
#define MOESH_KERNELS_CUDA_STREAM_FLAG_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace moesh::cuda {

// *flag = value on `stream` after the work before it (with a memory barrier:
// that work's writes are visible to whoever sees the value). `flag`: device
// memory, 4-byte aligned, else INVALID_ARGUMENT.
absl::Status StreamWriteFlag(cudaStream_t stream, uint32_t* flag, uint32_t value);

// The work queued on `stream` after this runs once *flag == value.
absl::Status StreamWaitFlag(cudaStream_t stream, uint32_t* flag, uint32_t value);

// cudaStreamSynchronize bounded by `timeout` (polling): DEADLINE_EXCEEDED if
// the stream's work is still running then (e.g. blocked on a flag nobody
// writes), the stream's error otherwise.
absl::Status SyncWithin(cudaStream_t stream, absl::Duration timeout);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_STREAM_FLAG_H_
