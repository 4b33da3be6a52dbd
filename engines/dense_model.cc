#include "engines/dense_model.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engines/half.h"

namespace warmpool::dense {
namespace {

using safetensors::DType;
using safetensors::TensorInfo;

template <typename... Args>
Status ModelError(std::string_view source, fmt::format_string<Args...> format, Args&&... args) {
  return Status(Code::kInvalidArgument, fmt::format("model file \"{}\": {}", source,
                                                    fmt::format(format, std::forward<Args>(args)...)));
}

struct ParsedName {
  uint64_t index = 0;
  bool is_bias = false;
};

// "<index>.weight" or "<index>.bias", the names nn.Sequential gives its Linear layers.
std::optional<ParsedName> ParseTensorName(std::string_view name) {
  size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 18) return std::nullopt;
  std::string_view digits = name.substr(0, dot);
  std::string_view kind = name.substr(dot + 1);
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;  // "00.weight" would alias "0.weight"
  ParsedName parsed;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    parsed.index = parsed.index * 10 + static_cast<uint64_t>(c - '0');
  }
  if (kind == "bias") {
    parsed.is_bias = true;
  } else if (kind != "weight") {
    return std::nullopt;
  }
  return parsed;
}

std::optional<Activation> ParseActivation(std::string_view name) {
  for (Activation activation : {Activation::kRelu, Activation::kGelu, Activation::kTanh, Activation::kNone}) {
    if (ActivationName(activation) == name) return activation;
  }
  return std::nullopt;
}

bool IsSupportedDType(DType dtype) { return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16; }

std::string ShapeText(const std::vector<uint64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Status ReadMetadata(const safetensors::Header& header, std::string_view source, DenseModel& model) {
  if (auto engine = header.metadata.find("engine"); engine != header.metadata.end() && engine->second != "dense") {
    return ModelError(source, "__metadata__ names engine \"{}\", not \"dense\"", engine->second);
  }
  if (auto activation = header.metadata.find("activation"); activation != header.metadata.end()) {
    std::optional<Activation> parsed = ParseActivation(activation->second);
    if (!parsed) {
      return ModelError(source, "unknown activation \"{}\" in __metadata__ (expected relu, gelu, tanh or none)",
                        activation->second);
    }
    model.activation = *parsed;
  }
  return OkStatus();
}

struct LayerTensors {
  const TensorInfo* weight = nullptr;
  const TensorInfo* bias = nullptr;
};

Result<LinearLayer> BuildLayer(uint64_t index, const LayerTensors& tensors, std::string_view source) {
  if (tensors.weight == nullptr) {
    return ModelError(source, "tensor \"{}\" has no matching \"{}.weight\"", tensors.bias->name, index);
  }
  const TensorInfo& weight = *tensors.weight;
  if (weight.shape.size() != 2) {
    return ModelError(source, "tensor \"{}\" has shape {}; a Linear weight is [out_features, in_features]",
                      weight.name, ShapeText(weight.shape));
  }
  for (uint64_t dim : weight.shape) {
    if (dim == 0 || dim > INT_MAX) {
      return ModelError(source, "tensor \"{}\" has shape {}; each dimension must be between 1 and {}",
                        weight.name, ShapeText(weight.shape), INT_MAX);
    }
  }
  LinearLayer layer;
  layer.index = index;
  layer.weight = weight;
  layer.out_features = static_cast<uint32_t>(weight.shape[0]);
  layer.in_features = static_cast<uint32_t>(weight.shape[1]);
  if (tensors.bias != nullptr) {
    const TensorInfo& bias = *tensors.bias;
    if (bias.shape.size() != 1 || bias.shape[0] != layer.out_features) {
      return ModelError(source, "tensor \"{}\" has shape {} but \"{}\" has {} output features, so it must be [{}]",
                        bias.name, ShapeText(bias.shape), weight.name, layer.out_features, layer.out_features);
    }
    layer.bias = bias;
  }
  return layer;
}

}  // namespace

std::string_view ActivationName(Activation activation) {
  switch (activation) {
    case Activation::kRelu: return "relu";
    case Activation::kGelu: return "gelu";
    case Activation::kTanh: return "tanh";
    case Activation::kNone: return "none";
  }
  return "?";
}

bool NeedsConversion(const TensorInfo& tensor) {
  return tensor.dtype != DType::F32 || tensor.begin % alignof(float) != 0;
}

Result<DenseModel> DescribeModel(const safetensors::Header& header, std::string_view source) {
  DenseModel model;
  if (Status metadata = ReadMetadata(header, source, model); !metadata.ok()) return metadata;

  std::map<uint64_t, LayerTensors> by_index;  // ordered numerically, which is execution order
  for (const TensorInfo& tensor : header.tensors) {
    std::optional<ParsedName> name = ParseTensorName(tensor.name);
    if (!name) {
      return ModelError(source, "tensor \"{}\" is not named <index>.weight or <index>.bias, as an "
                        "nn.Sequential of Linear layers names them", tensor.name);
    }
    if (!IsSupportedDType(tensor.dtype)) {
      return ModelError(source, "tensor \"{}\" has dtype {}; the dense engine supports F32, F16 and BF16",
                        tensor.name, safetensors::DTypeName(tensor.dtype));
    }
    LayerTensors& slot = by_index[name->index];
    (name->is_bias ? slot.bias : slot.weight) = &tensor;
  }
  if (by_index.empty()) {
    return ModelError(source, "no layers; expected tensors named 0.weight, 0.bias, 2.weight, ...");
  }

  for (const auto& [index, tensors] : by_index) {
    Result<LinearLayer> layer = BuildLayer(index, tensors, source);
    if (!layer.ok()) return layer.status();
    if (!model.layers.empty() && model.layers.back().out_features != layer->in_features) {
      const LinearLayer& previous = model.layers.back();
      return ModelError(source, "layers do not chain: \"{}\" produces {} features but \"{}\" (shape {}) takes {}",
                        previous.weight.name, previous.out_features, layer->weight.name,
                        ShapeText(layer->weight.shape), layer->in_features);
    }
    model.layers.push_back(std::move(*layer));
  }
  model.in_features = model.layers.front().in_features;
  model.out_features = model.layers.back().out_features;
  return model;
}

ScratchSizes ScratchFor(const DenseModel& model) {
  ScratchSizes sizes;
  uint64_t widest_hidden = 0;
  for (size_t i = 0; i + 1 < model.layers.size(); ++i) {
    widest_hidden = std::max<uint64_t>(widest_hidden, model.layers[i].out_features);
  }
  sizes.activation_floats = widest_hidden * kMaxBatch;
  for (const LinearLayer& layer : model.layers) {
    if (NeedsConversion(layer.weight)) sizes.conversion_floats = std::max(sizes.conversion_floats, layer.weight.numel());
    if (layer.weight.dtype == DType::BF16) {
      sizes.narrow_halves = std::max<uint64_t>(sizes.narrow_halves, uint64_t{kMaxBatch} * layer.in_features);
    }
    if (layer.bias) sizes.bias_floats += layer.out_features;
  }
  return sizes;
}

namespace {

uint32_t WidestLayer(const DenseModel& model) {
  uint32_t widest = model.in_features;
  for (const LinearLayer& layer : model.layers) widest = std::max({widest, layer.in_features, layer.out_features});
  return widest;
}

}  // namespace

GpuWorkspace PlanGpuWorkspace(const DenseModel& model) {
  GpuWorkspace w;
  uint64_t at = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t begin = at;
    at = (at + bytes + 255) / 256 * 256;
    return begin;
  };
  const uint64_t activation_bytes = uint64_t{kMaxBatch} * WidestLayer(model) * sizeof(float);
  w.activations[0] = take(activation_bytes);
  w.activations[1] = take(activation_bytes);
  bool sixteen = false;
  for (const LinearLayer& layer : model.layers) sixteen = sixteen || layer.weight.dtype != safetensors::DType::F32;
  w.half = take(sixteen ? activation_bytes / 2 : 0);
  for (const LinearLayer& layer : model.layers) {
    w.biases.push_back(layer.bias ? take(uint64_t{layer.out_features} * sizeof(float)) : kNoBias);
  }
  w.blas_bytes = kGpuBlasWorkspaceBytes;
  w.blas = take(w.blas_bytes);
  w.total = at;
  return w;
}

void WidenToFloat(const uint8_t* source, safetensors::DType dtype, uint64_t count, float* destination) {
  switch (dtype) {
    case safetensors::DType::F16:
      for (uint64_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, source + 2 * i, 2);
        destination[i] = safetensors::HalfToFloat(bits);
      }
      return;
    case safetensors::DType::BF16:
      for (uint64_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, source + 2 * i, 2);
        destination[i] = safetensors::BF16ToFloat(bits);
      }
      return;
    default:  // F32 that is not float-aligned in the region
      std::memcpy(destination, source, count * sizeof(float));
      return;
  }
}

}  // namespace warmpool::dense
