#include "engines/tensors/tensors.h"

#include <cstring>
#include <unordered_set>

#include <fmt/format.h>

#include "common/utf8.h"

namespace warmpool::tensors {

namespace {

struct DtypeNames {
  wp_dtype dtype;
  std::string_view name;
  std::string_view kserve;
  uint32_t element_bytes;
};
constexpr DtypeNames kDtypes[] = {
    {WP_DTYPE_F32, "f32", "FP32", 4},   {WP_DTYPE_F16, "f16", "FP16", 2},   {WP_DTYPE_BF16, "bf16", "BF16", 2},
    {WP_DTYPE_I32, "i32", "INT32", 4},  {WP_DTYPE_I64, "i64", "INT64", 8}, {WP_DTYPE_BYTES, "bytes", "BYTES", 0},
};

const DtypeNames* Find(uint32_t dtype) {
  for (const DtypeNames& d : kDtypes) {
    if (static_cast<uint32_t>(d.dtype) == dtype) return &d;
  }
  return nullptr;
}

// Each BYTES element is a uint32 length then its bytes; they must fill the data exactly.
Status CheckByteElements(const wp_tensor& t, uint64_t elements) {
  const auto* p = static_cast<const unsigned char*>(t.data);
  uint64_t at = 0;
  for (uint64_t i = 0; i < elements; i++) {
    if (t.bytes - at < sizeof(uint32_t)) {
      return Error(Code::kInvalidArgument, "tensor \"{}\": its bytes end inside element {} of {}", t.name, i,
                   elements);
    }
    uint32_t length = 0;
    std::memcpy(&length, p + at, sizeof(length));
    at += sizeof(length);
    if (t.bytes - at < length) {
      return Error(Code::kInvalidArgument, "tensor \"{}\": element {} says {} bytes, {} are left", t.name, i,
                   length, t.bytes - at);
    }
    at += length;
  }
  if (at != t.bytes) {
    return Error(Code::kInvalidArgument, "tensor \"{}\": {} bytes past its {} elements", t.name, t.bytes - at,
                 elements);
  }
  return OkStatus();
}

}  // namespace

std::string_view DtypeName(uint32_t dtype) {
  const DtypeNames* d = Find(dtype);
  return d != nullptr ? d->name : std::string_view();
}

std::string_view KserveName(uint32_t dtype) {
  const DtypeNames* d = Find(dtype);
  return d != nullptr ? d->kserve : std::string_view();
}

std::optional<wp_dtype> DtypeFromName(std::string_view name) {
  for (const DtypeNames& d : kDtypes) {
    if (name == d.name || name == d.kserve) return d.dtype;
  }
  return std::nullopt;
}

uint32_t ElementBytes(uint32_t dtype) {
  const DtypeNames* d = Find(dtype);
  return d != nullptr ? d->element_bytes : 0;
}

Result<uint64_t> ElementCount(std::span<const int64_t> shape) {
  constexpr uint64_t kLimit = uint64_t{1} << 62;
  uint64_t count = 1;
  for (int64_t size : shape) {
    if (size < 0) return Error(Code::kInvalidArgument, "shape {} has a negative size", ShapeText(shape));
    // Checked by division before the product: sizes come from clients.
    if (size != 0 && count > kLimit / static_cast<uint64_t>(size)) {
      return Error(Code::kInvalidArgument, "shape {} has more than 2^62 elements", ShapeText(shape));
    }
    count *= static_cast<uint64_t>(size);
  }
  return count;
}

std::string ShapeText(std::span<const int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

namespace {

// What a request's tensor and a signature's share: a name of 1 to 64 bytes of UTF-8 (it travels in
// protobuf strings, which must be), a known dtype, a rank up to 8.
Status CheckNameDtypeRank(const wp_tensor& t) {
  const size_t name_bytes = t.name == nullptr ? 0 : strnlen(t.name, kMaxNameBytes + 1);
  if (name_bytes == 0 || name_bytes > kMaxNameBytes || !IsValidUtf8(std::string_view(t.name, name_bytes))) {
    return Error(Code::kInvalidArgument, "a tensor needs a name of 1 to {} bytes of UTF-8", kMaxNameBytes);
  }
  if (Find(t.dtype) == nullptr) {
    return Error(Code::kInvalidArgument, "tensor \"{}\" has dtype {}: f32, f16, bf16, i32, i64 or bytes", t.name,
                 t.dtype);
  }
  if (t.rank > kMaxRank) {
    return Error(Code::kInvalidArgument, "tensor \"{}\" has {} dimensions: at most {}", t.name, t.rank, kMaxRank);
  }
  return OkStatus();
}

}  // namespace

Status CheckSignature(std::span<const wp_tensor> stated, std::string_view what) {
  if (stated.size() > kMaxTensors) return Error(Code::kInvalidArgument, "{} {}s: at most {}", stated.size(), what, kMaxTensors);
  std::unordered_set<std::string_view> names;
  for (const wp_tensor& s : stated) {
    if (Status c = CheckNameDtypeRank(s); !c.ok()) return c;
    for (uint32_t d = 0; d < s.rank; d++) {
      if (s.shape[d] < -1) {
        return Error(Code::kInvalidArgument, "{} \"{}\" has a size of {}: sizes are >= 0, or -1 for any", what,
                     s.name, s.shape[d]);
      }
    }
    if (!names.insert(s.name).second) return Error(Code::kInvalidArgument, "two {}s are named \"{}\"", what, s.name);
  }
  return OkStatus();
}

Status CheckTensor(const wp_tensor& t) {
  if (Status c = CheckNameDtypeRank(t); !c.ok()) return c;
  Result<uint64_t> elements = ElementCount(ShapeOf(t));
  if (!elements.ok()) return Error(Code::kInvalidArgument, "tensor \"{}\": {}", t.name, elements.status().message());
  if (t.data == nullptr && t.bytes != 0) {
    return Error(Code::kInvalidArgument, "tensor \"{}\" has no data for its {} bytes", t.name, t.bytes);
  }
  if (t.dtype == WP_DTYPE_BYTES) return CheckByteElements(t, *elements);
  const uint32_t size = ElementBytes(t.dtype);
  // elements < 2^62 and size <= 8: the product may still pass 2^64, so compare by division.
  if (t.bytes % size != 0 || t.bytes / size != *elements) {
    return Error(Code::kInvalidArgument, "tensor \"{}\" ({} {}) holds {} bytes, not {} elements x {}", t.name,
                 DtypeName(t.dtype), ShapeText(ShapeOf(t)), t.bytes, *elements, size);
  }
  return OkStatus();
}

Status CheckTensors(std::span<const wp_tensor> tensors, std::string_view what) {
  if (tensors.size() > kMaxTensors) {
    return Error(Code::kInvalidArgument, "{} {} tensors: at most {}", tensors.size(), what, kMaxTensors);
  }
  std::unordered_set<std::string_view> names;
  for (const wp_tensor& t : tensors) {
    if (Status s = CheckTensor(t); !s.ok()) return s;
    if (!names.insert(t.name).second) {
      return Error(Code::kInvalidArgument, "two {} tensors are named \"{}\"", what, t.name);
    }
  }
  return OkStatus();
}

Status MatchSignature(std::span<const wp_tensor> given, std::span<const wp_tensor> signature, std::string_view what) {
  auto expected = [&] {
    std::string list;
    for (const wp_tensor& s : signature) {
      list += fmt::format("{}\"{}\" {} {}", list.empty() ? "" : ", ", s.name, DtypeName(s.dtype),
                          ShapeText(ShapeOf(s)));
    }
    return list;
  };
  for (const wp_tensor& s : signature) {
    const wp_tensor* match = nullptr;
    for (const wp_tensor& g : given) {
      if (std::strcmp(g.name, s.name) == 0) match = &g;
    }
    if (match == nullptr) {
      return Error(Code::kInvalidArgument, "no {} tensor \"{}\": the model takes {}", what, s.name, expected());
    }
    bool fits = match->dtype == s.dtype && match->rank == s.rank;
    for (uint32_t d = 0; fits && d < s.rank; d++) fits = s.shape[d] < 0 || s.shape[d] == match->shape[d];
    if (!fits) {
      return Error(Code::kInvalidArgument, "{} tensor \"{}\" is {} {}: the model takes {} {} (-1: any size)", what,
                   s.name, DtypeName(match->dtype), ShapeText(ShapeOf(*match)), DtypeName(s.dtype),
                   ShapeText(ShapeOf(s)));
    }
  }
  if (given.size() != signature.size()) {  // names are distinct, and every one above was found
    for (const wp_tensor& g : given) {
      bool known = false;
      for (const wp_tensor& s : signature) known = known || std::strcmp(g.name, s.name) == 0;
      if (!known) {
        return Error(Code::kInvalidArgument, "{} tensor \"{}\" is not one the model takes ({})", what, g.name,
                     expected());
      }
    }
  }
  return OkStatus();
}

}  // namespace warmpool::tensors
