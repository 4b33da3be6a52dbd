#include "engines/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/utf8.h"
#include "engines/json_describe.h"

namespace warmpool::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; a big-endian host would need byte swaps");

using Json = nlohmann::json;

constexpr DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64,
                                DType::I32, DType::I16, DType::I8,  DType::U8,   DType::BOOL};

// Every problem with a file is reported the same way, naming the file first.
template <typename... Args>
Status FileError(std::string_view source, fmt::format_string<Args...> format, Args&&... args) {
  return Status(Code::kInvalidArgument,
                ValidUtf8(fmt::format("model file \"{}\": {}", source,
                                      fmt::format(format, std::forward<Args>(args)...))));
}

// A JSON value for an error message. Only scalars are printed, shortened: a hostile header can nest
// arrays millions deep, and printing those would recurse off the stack.
std::string ShapeText(const std::vector<uint64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// numel * element size, or nullopt when that does not fit in 64 bits.
std::optional<uint64_t> ByteSize(const std::vector<uint64_t>& shape, DType dtype) {
  uint64_t total = DTypeSize(dtype);
  for (uint64_t dim : shape) {
    if (__builtin_mul_overflow(total, dim, &total)) return std::nullopt;
  }
  return total;
}

Status CheckHeaderLength(uint64_t header_len, uint64_t file_size, std::string_view source) {
  if (header_len == 0) return FileError(source, "header length is 0; not a safetensors file");
  if (header_len > kMaxHeaderBytes) {
    return FileError(source, "header length {} exceeds the {}-byte limit; not a safetensors file",
                     header_len, kMaxHeaderBytes);
  }
  if (header_len > file_size - 8) {
    return FileError(source, "header length {} runs past the end of the {}-byte file", header_len,
                     file_size);
  }
  return OkStatus();
}

Result<uint64_t> ReadDimension(const Json& value, std::string_view source, const std::string& name) {
  if (!value.is_number_unsigned()) {
    return FileError(source, "tensor \"{}\": shape entries must be non-negative integers, got {}",
                     name, DescribeJson(value));
  }
  return value.get<uint64_t>();
}

Result<TensorInfo> ParseTensor(const std::string& name, const Json& entry, std::string_view source) {
  if (!entry.is_object()) {
    return FileError(source, "tensor \"{}\": entry must be an object, got {}", name, entry.type_name());
  }
  for (const auto& [key, unused] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return FileError(source, "tensor \"{}\": unknown key \"{}\" (expected dtype, shape, data_offsets)",
                       name, key);
    }
  }
  for (const char* required : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(required)) return FileError(source, "tensor \"{}\": missing \"{}\"", name, required);
  }
  TensorInfo tensor;
  tensor.name = name;

  const Json& dtype = entry["dtype"];
  std::optional<DType> parsed_dtype;
  if (dtype.is_string()) parsed_dtype = DTypeFromName(dtype.get<std::string>());
  if (!parsed_dtype) {
    return FileError(source, "tensor \"{}\": unknown dtype {} (known: F64, F32, F16, BF16, I64, I32, "
                     "I16, I8, U8, BOOL)", name, DescribeJson(dtype));
  }
  tensor.dtype = *parsed_dtype;

  const Json& shape = entry["shape"];
  if (!shape.is_array()) return FileError(source, "tensor \"{}\": shape must be an array, got {}", name, DescribeJson(shape));
  for (const Json& dim : shape) {
    Result<uint64_t> value = ReadDimension(dim, source, name);
    if (!value.ok()) return value.status();
    tensor.shape.push_back(*value);
  }
  std::optional<uint64_t> needed = ByteSize(tensor.shape, tensor.dtype);
  if (!needed) {
    return FileError(source, "tensor \"{}\": shape {} of {} is too large (byte size overflows 64 bits)",
                     name, ShapeText(tensor.shape), DTypeName(tensor.dtype));
  }

  const Json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return FileError(source, "tensor \"{}\": data_offsets must be [begin, end] of non-negative "
                     "integers, got {}", name, DescribeJson(offsets));
  }
  tensor.begin = offsets[0].get<uint64_t>();
  tensor.end = offsets[1].get<uint64_t>();
  if (tensor.begin > tensor.end) {
    return FileError(source, "tensor \"{}\": data_offsets [{}, {}) end before they begin", name,
                     tensor.begin, tensor.end);
  }
  if (tensor.end - tensor.begin != *needed) {
    return FileError(source, "tensor \"{}\": data_offsets [{}, {}) hold {} bytes but shape {} of {} needs {}",
                     name, tensor.begin, tensor.end, tensor.end - tensor.begin,
                     ShapeText(tensor.shape), DTypeName(tensor.dtype), *needed);
  }
  return tensor;
}

Result<std::map<std::string, std::string>> ParseMetadata(const Json& value, std::string_view source) {
  if (!value.is_object()) {
    return FileError(source, "__metadata__ must be an object of strings, got {}", value.type_name());
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return FileError(source, "__metadata__ \"{}\" must be a string, got {}", key, DescribeJson(item));
    }
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

// Tensors sorted by begin must tile the data area exactly: no overlap, no hole, nothing past it.
Status CheckLayout(const Header& header, std::string_view source) {
  const uint64_t data_area = header.file_size - header.data_offset;
  uint64_t cursor = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& tensor : header.tensors) {
    if (tensor.end > data_area) {
      return FileError(source, "tensor \"{}\": data_offsets [{}, {}) run past the end of the "
                       "{}-byte data area (file truncated?)", tensor.name, tensor.begin, tensor.end,
                       data_area);
    }
    if (tensor.begin < cursor) {
      return FileError(source, "tensor \"{}\": data_offsets [{}, {}) overlap tensor \"{}\" [{}, {})",
                       tensor.name, tensor.begin, tensor.end, previous->name, previous->begin,
                       previous->end);
    }
    if (tensor.begin > cursor) {
      return FileError(source, "tensor \"{}\": data_offsets [{}, {}) leave a hole after byte {} of "
                       "the data area", tensor.name, tensor.begin, tensor.end, cursor);
    }
    cursor = tensor.end;
    previous = &tensor;
  }
  if (cursor != data_area) {
    return FileError(source, "data area is {} bytes but the tensors cover only {} (trailing bytes)",
                     data_area, cursor);
  }
  return OkStatus();
}

Status PreadFully(int fd, uint8_t* buffer, uint64_t bytes, uint64_t offset, std::string_view path) {
  uint64_t done = 0;
  while (done < bytes) {
    ssize_t n = pread(fd, buffer + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      return Status(CodeForErrno(err), fmt::format("model file \"{}\": read failed: {}", path, std::strerror(err)));
    }
    if (n == 0) return FileError(path, "file ended at byte {} while reading its header", offset + done);
    done += static_cast<uint64_t>(n);
  }
  return OkStatus();
}

Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const auto* cursor = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    ssize_t n = write(fd, cursor, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      return Status(CodeForErrno(err), fmt::format("cannot write \"{}\": {}", path, std::strerror(err)));
    }
    cursor += n;
    bytes -= static_cast<size_t>(n);
  }
  return OkStatus();
}

Result<std::string> BuildHeaderJson(const std::vector<TensorToWrite>& tensors,
                                    const std::map<std::string, std::string>& metadata,
                                    const std::string& path) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorToWrite& tensor : tensors) {
    if (tensor.name.empty() || tensor.name == "__metadata__") {
      return Error(Code::kInvalidArgument, "cannot write \"{}\": invalid tensor name \"{}\"", path, tensor.name);
    }
    if (!names.insert(tensor.name).second) {
      return Error(Code::kInvalidArgument, "cannot write \"{}\": tensor \"{}\" appears twice", path, tensor.name);
    }
    std::optional<uint64_t> needed = ByteSize(tensor.shape, tensor.dtype);
    if (!needed || *needed != tensor.data.size()) {
      return Error(Code::kInvalidArgument, "cannot write \"{}\": tensor \"{}\" has {} bytes of data but "
                   "shape {} of {} needs {}", path, tensor.name, tensor.data.size(),
                   ShapeText(tensor.shape), DTypeName(tensor.dtype),
                   needed ? fmt::to_string(*needed) : std::string("more than 2^64"));
    }
    header[tensor.name] = {{"dtype", std::string(DTypeName(tensor.dtype))},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + *needed}}};
    offset += *needed;
  }
  std::string text = header.dump();
  // Padding keeps the data area 8-byte aligned in the file; the format allows trailing spaces.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

uint64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::I8: case DType::U8: case DType::BOOL: return 1;
  }
  return 1;
}

std::optional<DType> DTypeFromName(std::string_view name) {
  for (DType dtype : kAllDTypes) {
    if (DTypeName(dtype) == name) return dtype;
  }
  return std::nullopt;
}

uint64_t TensorInfo::numel() const {
  uint64_t count = 1;
  for (uint64_t dim : shape) count *= dim;
  return count;
}

const TensorInfo* Header::Find(std::string_view name) const {
  for (const TensorInfo& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

Result<Header> ParseHeader(std::span<const uint8_t> file_prefix, uint64_t file_size, std::string_view source) {
  if (file_size < 8) {
    return FileError(source, "file is {} bytes, too short for the 8-byte safetensors header length", file_size);
  }
  if (file_prefix.size() < 8) {
    return FileError(source, "only {} bytes of the file were read; the header length needs 8", file_prefix.size());
  }
  Header header;
  std::memcpy(&header.header_len, file_prefix.data(), 8);
  if (Status length = CheckHeaderLength(header.header_len, file_size, source); !length.ok()) return length;
  header.data_offset = 8 + header.header_len;
  header.file_size = file_size;
  if (file_prefix.size() < header.data_offset) {
    return FileError(source, "only {} bytes of the file were read; the header needs {}",
                     file_prefix.size(), header.data_offset);
  }

  Json root;
  try {
    const auto* text = reinterpret_cast<const char*>(file_prefix.data() + 8);
    root = Json::parse(text, text + header.header_len);
  } catch (const Json::exception& e) {
    return FileError(source, "header is not valid JSON: {}", e.what());
  }
  if (!root.is_object()) return FileError(source, "header must be a JSON object, got {}", root.type_name());

  try {
    for (const auto& [name, entry] : root.items()) {
      if (name == "__metadata__") {
        Result<std::map<std::string, std::string>> metadata = ParseMetadata(entry, source);
        if (!metadata.ok()) return metadata.status();
        header.metadata = std::move(*metadata);
        continue;
      }
      Result<TensorInfo> tensor = ParseTensor(name, entry, source);
      if (!tensor.ok()) return tensor.status();
      header.data_bytes += tensor->bytes();
      header.tensors.push_back(std::move(*tensor));
    }
  } catch (const Json::exception& e) {
    return FileError(source, "malformed header: {}", e.what());
  }
  std::sort(header.tensors.begin(), header.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  if (Status layout = CheckLayout(header, source); !layout.ok()) return layout;
  return header;
}

Result<Header> ReadHeader(const std::string& path, std::vector<uint8_t>* raw) {
  // Registered paths are resolved already: a symlink here is one swapped in since, and a FIFO must
  // not block the caller (the supervisor's loop) in open; fstat below refuses it.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    if (err == ELOOP) return FileError(path, "is a symlink now; reload to resolve it again");
    return Status(CodeForErrno(err), fmt::format("model file \"{}\": cannot open: {}", path, std::strerror(err)));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { close(fd); }
  } closer{fd};

  return ReadHeaderFrom(fd, path, raw);
}

Result<Header> ReadHeaderFrom(int fd, std::string_view path, std::vector<uint8_t>* raw) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    return Status(CodeForErrno(err), fmt::format("model file \"{}\": cannot stat: {}", path, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) return FileError(path, "not a regular file");
  const auto file_size = static_cast<uint64_t>(st.st_size);

  std::vector<uint8_t> prefix(std::min<uint64_t>(file_size, 8));
  if (Status read = PreadFully(fd, prefix.data(), prefix.size(), 0, path); !read.ok()) return read;
  uint64_t header_len = 0;
  if (prefix.size() == 8) std::memcpy(&header_len, prefix.data(), 8);
  // Only read the header when its length is sane; otherwise ParseHeader explains what is wrong.
  if (prefix.size() == 8 && CheckHeaderLength(header_len, file_size, path).ok()) {
    prefix.resize(8 + header_len);
    if (Status read = PreadFully(fd, prefix.data() + 8, header_len, 8, path); !read.ok()) return read;
  }
  Result<Header> header = ParseHeader(prefix, file_size, path);
  if (header.ok() && raw != nullptr) *raw = std::move(prefix);
  return header;
}

Status WriteFile(const std::string& path, const std::vector<TensorToWrite>& tensors,
                 const std::map<std::string, std::string>& metadata) {
  std::string header_json;
  try {
    Result<std::string> built = BuildHeaderJson(tensors, metadata, path);
    if (!built.ok()) return built.status();
    header_json = std::move(*built);
  } catch (const Json::exception& e) {
    return Error(Code::kInvalidArgument, "cannot write \"{}\": {}", path, e.what());
  }

  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    return Status(CodeForErrno(err), fmt::format("cannot create \"{}\": {}", path, std::strerror(err)));
  }
  const uint64_t header_len = header_json.size();
  Status status = WriteAll(fd, &header_len, 8, path);
  if (status.ok()) status = WriteAll(fd, header_json.data(), header_json.size(), path);
  for (const TensorToWrite& tensor : tensors) {
    if (!status.ok()) break;
    status = WriteAll(fd, tensor.data.data(), tensor.data.size(), path);
  }
  if (status.ok() && fsync(fd) != 0) {
    int err = errno;
    status = Status(CodeForErrno(err), fmt::format("cannot sync \"{}\": {}", path, std::strerror(err)));
  }
  if (close(fd) != 0 && status.ok()) {
    int err = errno;
    status = Status(CodeForErrno(err), fmt::format("cannot close \"{}\": {}", path, std::strerror(err)));
  }
  if (!status.ok()) unlink(path.c_str());  // a partial file is worse than none
  return status;
}

}  // namespace warmpool::safetensors
