// Reader and writer for the safetensors format (https://github.com/huggingface/safetensors):
//   [u64 little-endian header_len][header_len bytes of JSON][data area]
// The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} with offsets
// relative to the data area, plus an optional "__metadata__" object of strings.
//
// Everything in a header is checked before anyone trusts an offset: a model file is user input.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace warmpool::safetensors {

// Headers beyond this are refused before any allocation; real models stay far below it.
inline constexpr uint64_t kMaxHeaderBytes = 16ull << 20;

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

// "F32", "BF16", ... as spelled in safetensors headers.
std::string_view DTypeName(DType dtype);
// Bytes per element.
uint64_t DTypeSize(DType dtype);
std::optional<DType> DTypeFromName(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // offsets relative to the start of the data area
  uint64_t end = 0;

  uint64_t numel() const;
  uint64_t bytes() const { return end - begin; }
};

struct Header {
  uint64_t header_len = 0;
  uint64_t data_offset = 0;  // 8 + header_len: where the data area starts in the file
  uint64_t data_bytes = 0;   // sum of tensor byte sizes (the data area has no holes)
  uint64_t file_size = 0;    // size of the file the header was read from
  std::vector<TensorInfo> tensors;  // sorted by begin
  std::map<std::string, std::string> metadata;

  const TensorInfo* Find(std::string_view name) const;
};

// file_prefix holds the first bytes of the file: at least the 8-byte length and the header.
// source names the file in error messages.
Result<Header> ParseHeader(std::span<const uint8_t> file_prefix, uint64_t file_size,
                           std::string_view source = "<memory>");

// Opens path and reads only its header, never the tensor data.
// raw, when given, receives the bytes the header was parsed from (length prefix included), so that
// the model can be described again later without the file.
Result<Header> ReadHeader(const std::string& path, std::vector<uint8_t>* raw = nullptr);
// The same from a file already open (opened beneath a model root by the supervisor); `path` names
// it in messages only. Reads with pread: the descriptor's offset is left alone.
Result<Header> ReadHeaderFrom(int fd, std::string_view path, std::vector<uint8_t>* raw = nullptr);

struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> data;  // numel * DTypeSize(dtype) bytes, little-endian
};

// Writes tensors in the given order with the header padded by spaces to 8-byte alignment.
// Writes path in place; callers that need atomicity write a temporary file and rename it.
Status WriteFile(const std::string& path, const std::vector<TensorToWrite>& tensors,
                 const std::map<std::string, std::string>& metadata);

}  // namespace warmpool::safetensors
