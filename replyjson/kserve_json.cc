#include "replyjson/kserve_json.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "common/utf8.h"
#include "engines/half.h"
#include "engines/tensors/tensor_proto.h"

namespace warmpool::replyjson {

using nlohmann::json;
using safetensors::BF16ToFloat;
using safetensors::FloatToBF16;
using safetensors::FloatToHalf;
using safetensors::HalfToFloat;

namespace {

// Nested lists deeper than a tensor's rank plus one are a hostile document, not data.
constexpr int kMaxNesting = tensors::kMaxRank + 1;

Status Flatten(const json& value, int depth, std::vector<const json*>& leaves) {
  if (!value.is_array()) {
    leaves.push_back(&value);
    return OkStatus();
  }
  if (depth >= kMaxNesting) return Error(Code::kInvalidArgument, "data is nested more than {} deep", kMaxNesting);
  for (const json& v : value) {
    if (Status s = Flatten(v, depth + 1, leaves); !s.ok()) return s;
  }
  return OkStatus();
}

template <typename T>
void Append(std::string& data, T value) {
  data.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// One element of `dtype` from a JSON value, appended to data.
Status AppendElement(uint32_t dtype, const json& v, std::string& data) {
  if (dtype == WP_DTYPE_BYTES) {
    if (!v.is_string()) return Error(Code::kInvalidArgument, "is not a string (BYTES elements are strings)");
    const std::string& s = v.get_ref<const std::string&>();
    if (s.size() > std::numeric_limits<uint32_t>::max()) return Error(Code::kInvalidArgument, "is over 4 GiB");
    Append(data, static_cast<uint32_t>(s.size()));
    data += s;
    return OkStatus();
  }
  if (dtype == WP_DTYPE_I32 || dtype == WP_DTYPE_I64) {
    if (!v.is_number_integer()) return Error(Code::kInvalidArgument, "is not an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) {
      return Error(Code::kInvalidArgument, "is outside the range of {}", tensors::KserveName(dtype));
    }
    const int64_t x = v.get<int64_t>();
    if (dtype == WP_DTYPE_I64) {
      Append(data, x);
      return OkStatus();
    }
    if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max()) {
      return Error(Code::kInvalidArgument, "is outside the range of INT32");
    }
    Append(data, static_cast<int32_t>(x));
    return OkStatus();
  }
  if (!v.is_number()) return Error(Code::kInvalidArgument, "is not a number");
  const double x = v.get<double>();
  const double limit = dtype == WP_DTYPE_F16 ? 65504.0 : std::numeric_limits<float>::max();
  if (!std::isfinite(x) || std::fabs(x) > limit) {
    return Error(Code::kInvalidArgument, "is {}, outside the range of {}", x, tensors::KserveName(dtype));
  }
  const auto f = static_cast<float>(x);
  if (dtype == WP_DTYPE_F32) {
    Append(data, f);
  } else if (dtype == WP_DTYPE_F16) {
    Append(data, FloatToHalf(f));
  } else {
    // The largest floats round up past bfloat16's largest finite value.
    const uint16_t b = FloatToBF16(f);
    if ((b & 0x7fff) == 0x7f80) return Error(Code::kInvalidArgument, "is {}, outside the range of BF16", x);
    Append(data, b);
  }
  return OkStatus();
}

}  // namespace

Result<v1::NamedTensor> TensorFromKserve(const json& t) {
  if (!t.is_object()) return Error(Code::kInvalidArgument, "a tensor must be an object with name, shape, datatype, data");
  for (const auto& [key, _] : t.items()) {
    if (key != "name" && key != "shape" && key != "datatype" && key != "data" && key != "parameters") {
      return Error(Code::kInvalidArgument, "a tensor has no \"{}\": name, shape, datatype, data", key);
    }
  }
  if (!t.contains("name") || !t["name"].is_string()) return Error(Code::kInvalidArgument, "a tensor needs a \"name\"");
  v1::NamedTensor out;
  out.set_name(t["name"].get<std::string>());
  const std::string& name = out.name();
  if (!t.contains("datatype") || !t["datatype"].is_string()) {
    return Error(Code::kInvalidArgument, "tensor \"{}\" needs a \"datatype\": FP32, FP16, BF16, INT32, INT64 or BYTES",
                 name);
  }
  std::optional<wp_dtype> dtype = tensors::DtypeFromName(t["datatype"].get<std::string>());
  if (!dtype) {
    return Error(Code::kInvalidArgument, "tensor \"{}\" has datatype \"{}\": FP32, FP16, BF16, INT32, INT64 or BYTES",
                 name, t["datatype"].get<std::string>());
  }
  out.set_dtype(static_cast<v1::DType>(*dtype));
  if (!t.contains("shape") || !t["shape"].is_array() || t["shape"].size() > tensors::kMaxRank) {
    return Error(Code::kInvalidArgument, "tensor \"{}\" needs a \"shape\": a list of at most {} sizes", name,
                 tensors::kMaxRank);
  }
  for (const json& size : t["shape"]) {
    if (!size.is_number_integer() || (size.is_number_unsigned() && size.get<uint64_t>() > uint64_t{INT64_MAX}) ||
        size.get<int64_t>() < 0) {
      return Error(Code::kInvalidArgument, "tensor \"{}\": every size of its shape is an integer >= 0", name);
    }
    out.add_shape(size.get<int64_t>());
  }
  Result<uint64_t> count = tensors::ElementCount(std::vector<int64_t>(out.shape().begin(), out.shape().end()));
  if (!count.ok()) return Error(Code::kInvalidArgument, "tensor \"{}\": {}", name, count.status().message());
  if (!t.contains("data")) return Error(Code::kInvalidArgument, "tensor \"{}\" has no \"data\"", name);
  std::vector<const json*> leaves;
  if (Status s = Flatten(t["data"], 0, leaves); !s.ok()) return Error(Code::kInvalidArgument, "tensor \"{}\": {}", name, s.message());
  if (leaves.size() != *count) {
    return Error(Code::kInvalidArgument, "tensor \"{}\" has {} values for shape {} ({} elements)", name,
                 leaves.size(), tensors::ShapeText(std::vector<int64_t>(out.shape().begin(), out.shape().end())),
                 *count);
  }
  std::string data;
  for (size_t i = 0; i < leaves.size(); i++) {
    if (Status s = AppendElement(*dtype, *leaves[i], data); !s.ok()) {
      return Error(Code::kInvalidArgument, "tensor \"{}\": value {} {}", name, i, s.message());
    }
  }
  out.set_data(std::move(data));
  return out;
}

Result<std::vector<v1::NamedTensor>> TensorsFromKserve(const json& list) {
  if (!list.is_array() || list.empty()) return Error(Code::kInvalidArgument, "\"inputs\" must be a non-empty list of tensors");
  if (list.size() > tensors::kMaxTensors) {
    return Error(Code::kInvalidArgument, "{} tensors: at most {}", list.size(), tensors::kMaxTensors);
  }
  std::vector<v1::NamedTensor> out;
  for (const json& t : list) {
    Result<v1::NamedTensor> one = TensorFromKserve(t);
    if (!one.ok()) return one.status();
    out.push_back(std::move(*one));
  }
  // Names as the daemon judges them (1 to 64 bytes, no NUL, distinct): refused here, in JSON's terms.
  google::protobuf::RepeatedPtrField<v1::NamedTensor> all(out.begin(), out.end());
  if (Status s = tensors::CheckNamedTensors(all, "input"); !s.ok()) return s;
  return out;
}

Result<json> KserveTensor(const v1::NamedTensor& t) {
  if (Status s = tensors::CheckTensor(tensors::ViewOf(t)); !s.ok()) return s;
  json data = json::array();
  const std::string& bytes = t.data();
  auto at = [&](size_t offset, auto zero) {
    std::memcpy(&zero, bytes.data() + offset, sizeof(zero));
    return zero;
  };
  switch (t.dtype()) {
    case v1::DTYPE_F32:
      for (size_t o = 0; o < bytes.size(); o += 4) data.push_back(at(o, 0.0f));
      break;
    case v1::DTYPE_F16:
      for (size_t o = 0; o < bytes.size(); o += 2) data.push_back(HalfToFloat(at(o, uint16_t{0})));
      break;
    case v1::DTYPE_BF16:
      for (size_t o = 0; o < bytes.size(); o += 2) data.push_back(BF16ToFloat(at(o, uint16_t{0})));
      break;
    case v1::DTYPE_I32:
      for (size_t o = 0; o < bytes.size(); o += 4) data.push_back(at(o, int32_t{0}));
      break;
    case v1::DTYPE_I64:
      for (size_t o = 0; o < bytes.size(); o += 8) data.push_back(at(o, int64_t{0}));
      break;
    default:  // BYTES (CheckTensor knows no other): whole elements, checked above
      for (size_t o = 0; o < bytes.size();) {
        const uint32_t length = at(o, uint32_t{0});
        std::string element = bytes.substr(o + 4, length);
        if (!IsValidUtf8(element)) {
          return Error(Code::kFailedPrecondition,
                       "output \"{}\" holds bytes that are not UTF-8, which JSON cannot carry: ask through the "
                       "framed protocol (C++ or Python client)",
                       t.name());
        }
        data.push_back(std::move(element));
        o += 4 + length;
      }
  }
  json shape = json::array();
  for (int64_t s : t.shape()) shape.push_back(s);
  return json{{"name", t.name()}, {"shape", std::move(shape)}, {"datatype", tensors::KserveName(t.dtype())},
              {"data", std::move(data)}};
}

json KserveSpecs(const google::protobuf::RepeatedPtrField<v1::NamedTensor>& tensors) {
  json out = json::array();
  for (const v1::NamedTensor& t : tensors) {
    out.push_back({{"name", t.name()},
                   {"datatype", tensors::KserveName(t.dtype())},
                   {"shape", std::vector<int64_t>(t.shape().begin(), t.shape().end())}});
  }
  return out;
}

}  // namespace warmpool::replyjson
