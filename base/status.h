// Status helpers shared by every moesh library.
//
// Library code returns absl::Status / absl::StatusOr<T>; services convert to
// grpc::Status only at their edge. Codes are chosen so they map 1:1 onto gRPC
// (INVALID_ARGUMENT for bad input, NOT_FOUND for missing files, DATA_LOSS for
// corrupt files, RESOURCE_EXHAUSTED, UNAVAILABLE, ...).
#ifndef MOESH_COMMON_BASE_STATUS_H_
#define MOESH_COMMON_BASE_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MOESH_CONCAT_INNER_(a, b) a##b
#define MOESH_CONCAT_(a, b) MOESH_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status moesh_status_ = (expr);         \
    if (!moesh_status_.ok()) return moesh_status_; \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or returns its status.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL_(MOESH_CONCAT_(moesh_statusor_, __LINE__), lhs, rexpr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr)  \
  auto tmp = (rexpr);                            \
  if (!tmp.ok()) return std::move(tmp).status(); \
  lhs = std::move(tmp).value()

#endif  // MOESH_COMMON_BASE_STATUS_H_
