// Helpers shared by the loom backend's files: errors raised into Python, and Loom's data
// type of a tensor to reduce.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <loom/loom.h>

#include <string>

namespace loom::torchext {

// Throws a c10::Error (RuntimeError in Python) that starts with "loom: ".
[[noreturn]] inline void fail(const std::string& message) { TORCH_CHECK(false, "loom: ", message); }

// A queued call returns loomInProgress; anything else but success is refused at once, with
// Loom's message (which names the argument).
inline void check(loomResult_t r, const char* call) {
  if (r == loomSuccess || r == loomInProgress) return;
  fail(std::string(call) + ": " + loomGetErrorString(r) + ": " + loomGetLastError(nullptr));
}

// Loom's data type for reducing t; bool reduces as uint8 (LoomBackend::redOp maps its
// operations), a complex tensor as its real and imaginary parts (sums only).
inline loomDataType_t reduceType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
    case at::kComplexFloat:
      return loomFloat32;
    case at::kDouble:
    case at::kComplexDouble:
      return loomFloat64;
    case at::kHalf:
    case at::kComplexHalf:
      return loomFloat16;
    case at::kBFloat16:
      return loomBfloat16;
    case at::kChar:
      return loomInt8;
    case at::kByte:
    case at::kBool:
      return loomUint8;
    case at::kInt:
      return loomInt32;
    case at::kLong:
      return loomInt64;
    default:
      fail(std::string("tensor: ") + c10::toString(t.scalar_type()) +
           " cannot be reduced by the loom backend");
  }
}

// How many elements of reduceType(t) t holds.
inline size_t reduceCount(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * (t.is_complex() ? 2 : 1);
}

}  // namespace loom::torchext
