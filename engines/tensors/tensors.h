// Typed tensors (engine ABI version 5, warmpool/engine.h): what a well-formed one is, and whether a
// request's tensors are what an engine's signature says it takes. One set of rules for every place
// that judges tensors: the core (before any worker), the worker (against its engine), the clients.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "warmpool/engine.h"

namespace warmpool::tensors {

inline constexpr uint32_t kMaxRank = WP_TENSOR_MAX_RANK;
inline constexpr size_t kMaxNameBytes = 64;
// Tensors in one request or one reply.
inline constexpr size_t kMaxTensors = 64;

// "f32", "f16", "bf16", "i32", "i64", "bytes"; empty for an unknown value.
std::string_view DtypeName(uint32_t dtype);
// The names above, and KServe's ("FP32", "FP16", "BF16", "INT32", "INT64", "BYTES").
std::optional<wp_dtype> DtypeFromName(std::string_view name);
// KServe's name of a dtype ("FP32"...); empty for an unknown value.
std::string_view KserveName(uint32_t dtype);
// Bytes per element; 0 for BYTES (variable) and unknown values.
uint32_t ElementBytes(uint32_t dtype);

// The elements of a shape (1 for rank 0). INVALID_ARGUMENT for a negative size or a product past
// 2^62 (no such tensor fits any frame; hostile shapes must not overflow).
Result<uint64_t> ElementCount(std::span<const int64_t> shape);
// "[2, 16]"; "[-1, 16]" in a signature.
std::string ShapeText(std::span<const int64_t> shape);
inline std::span<const int64_t> ShapeOf(const wp_tensor& t) {
  return {t.shape, t.rank <= kMaxRank ? t.rank : kMaxRank};
}

// A tensor of a request or a reply: a name of 1 to 64 bytes of UTF-8, a known dtype, a rank up to 8, sizes
// >= 0, and data of exactly its elements' bytes (for BYTES: every element's length and bytes,
// nothing left over). Reads BYTES lengths with memcpy: the data need not be aligned.
Status CheckTensor(const wp_tensor& tensor);
// What an engine states it takes or gives (a signature): up to kMaxTensors tensors of distinct
// names, each as CheckTensor judges a name, dtype and rank, its sizes >= 0 or -1 (any); no data.
Status CheckSignature(std::span<const wp_tensor> stated, std::string_view what);
// Up to kMaxTensors well-formed tensors with distinct names.
Status CheckTensors(std::span<const wp_tensor> tensors, std::string_view what);

// given matches signature: the same names (none missing, none more), each of the signature's dtype
// and rank and of its sizes where they are not -1. `what` is "input" or "output" for the message.
Status MatchSignature(std::span<const wp_tensor> given, std::span<const wp_tensor> signature, std::string_view what);

}  // namespace warmpool::tensors
