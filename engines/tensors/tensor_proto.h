// Typed tensors on the wire (warmpool.v1.NamedTensor) seen through the ABI's wp_tensor, so that the
// core, the workers and the clients judge them by the same rules (engines/tensors/tensors.h).
// Header only: its users link the protocol themselves.
#pragma once

#include <algorithm>
#include <string_view>
#include <vector>

#include "engines/tensors/tensors.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::tensors {

constexpr bool SameDtypes() {
  const int pairs[][2] = {{v1::DTYPE_F32, WP_DTYPE_F32}, {v1::DTYPE_F16, WP_DTYPE_F16}, {v1::DTYPE_BF16, WP_DTYPE_BF16},
                          {v1::DTYPE_I32, WP_DTYPE_I32}, {v1::DTYPE_I64, WP_DTYPE_I64}, {v1::DTYPE_BYTES, WP_DTYPE_BYTES}};
  for (const auto& p : pairs) {
    if (p[0] != p[1]) return false;
  }
  return static_cast<int>(v1::DType_MAX) == static_cast<int>(WP_DTYPE_BYTES);
}
static_assert(SameDtypes(), "warmpool.v1.DType and wp_dtype differ: change both");

// The message as a wp_tensor, with no copy: valid while the message lives. Its data may be
// unaligned; a shape of more than kMaxRank sizes keeps its rank (CheckTensor refuses it).
inline wp_tensor ViewOf(const v1::NamedTensor& t) {
  wp_tensor view{t.name().c_str(), static_cast<uint32_t>(t.dtype()), static_cast<uint32_t>(t.shape_size()), {},
                 t.data().data(), t.data().size()};
  std::copy_n(t.shape().begin(), std::min<int>(t.shape_size(), kMaxRank), view.shape);
  return view;
}

// CheckTensors on messages, and names with no NUL byte inside (the ABI's names end at the first).
inline Status CheckNamedTensors(const google::protobuf::RepeatedPtrField<v1::NamedTensor>& tensors,
                                std::string_view what) {
  std::vector<wp_tensor> views;
  views.reserve(tensors.size());
  for (const v1::NamedTensor& t : tensors) {
    if (t.name().find('\0') != std::string::npos) {
      return Error(Code::kInvalidArgument, "an {} tensor's name holds a NUL byte", what);
    }
    views.push_back(ViewOf(t));
  }
  return CheckTensors(views, what);
}

// A wp_tensor into a message (an engine's output into a reply).
inline void CopyInto(const wp_tensor& t, v1::NamedTensor* out) {
  out->set_name(t.name);
  out->set_dtype(static_cast<v1::DType>(t.dtype));
  for (uint32_t d = 0; d < t.rank; d++) out->add_shape(t.shape[d]);
  if (t.bytes != 0) out->set_data(static_cast<const char*>(t.data), t.bytes);
}

}  // namespace warmpool::tensors
