// Typed tensors for the C++ client (InferRequest.inputs, engine ABI version 5): built from values,
// read back as values. Little-endian hosts only, as the wire's floats are everywhere else.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::client {

template <typename T>
constexpr v1::DType DtypeOf() {
  if constexpr (std::is_same_v<T, float>) return v1::DTYPE_F32;
  else if constexpr (std::is_same_v<T, int32_t>) return v1::DTYPE_I32;
  else if constexpr (std::is_same_v<T, int64_t>) return v1::DTYPE_I64;
  else static_assert(sizeof(T) == 0, "f32, i32 or i64: build f16, bf16 and bytes tensors by hand");
}

// A tensor of `values` (row-major) and `shape`; the daemon checks that they agree.
template <typename T>
v1::NamedTensor TensorOf(std::string name, std::vector<int64_t> shape, std::span<const T> values) {
  v1::NamedTensor t;
  t.set_name(std::move(name));
  t.set_dtype(DtypeOf<T>());
  for (int64_t size : shape) t.add_shape(size);
  t.set_data(reinterpret_cast<const char*>(values.data()), values.size_bytes());
  return t;
}

// A tensor's values, when it is of T's dtype.
template <typename T>
Result<std::vector<T>> ValuesOf(const v1::NamedTensor& t) {
  if (t.dtype() != DtypeOf<T>() || t.data().size() % sizeof(T) != 0) {
    return Error(Code::kInvalidArgument, "tensor \"{}\" is of dtype {}, {} bytes: not what was asked for", t.name(),
                 v1::DType_Name(t.dtype()), t.data().size());
  }
  std::vector<T> values(t.data().size() / sizeof(T));
  std::memcpy(values.data(), t.data().data(), t.data().size());
  return values;
}

}  // namespace warmpool::client
