// The one error-propagation idiom of the project: every function that can fail returns
// absl::Status or absl::StatusOr<T>, and early returns are spelled with these two macros
// (never by hand), so that a reader sees at a glance which calls can end the function.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if not ok.
#define RETURN_IF_ERROR(expr)                                                     \
  do {                                                                            \
    if (absl::Status glm_status_ = (expr); !glm_status_.ok()) return glm_status_; \
  } while (false)

// `ASSIGN_OR_RETURN(lhs, expr)`: evaluates `expr` (an absl::StatusOr<T>), returns its status
// if not ok, and otherwise moves the value into `lhs` (a declaration such as `auto x` or an
// existing lvalue).
#define ASSIGN_OR_RETURN(lhs, expr) \
  GLM_ASSIGN_OR_RETURN_IMPL_(GLM_STATUS_MACROS_CONCAT_(glm_statusor_, __LINE__), lhs, expr)

#define GLM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)    \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)

#define GLM_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define GLM_STATUS_MACROS_CONCAT_(a, b) GLM_STATUS_MACROS_CONCAT_INNER_(a, b)
