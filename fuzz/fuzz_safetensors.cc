// The safetensors header reader and the dense model description built on it, on hostile files.
//
// Input: the bytes of a model file. Each run parses it
//   1. in memory, as a file of exactly these bytes (safetensors::ParseHeader);
//   2. from a file holding these bytes (safetensors::ReadHeader on a file in /dev/shm: a real path,
//      since the reader refuses symlinks such as /proc/self/fd/N), which must agree;
//   3. with only the first half of the bytes read, which must never read past them;
//   4. as the header of a larger (sparse) file whose size the header's largest data offset implies,
//      so that headers of huge tensors get past the layout check without huge inputs.
// On success the header's invariants are checked and dense::DescribeModel and ScratchFor run on
// it. Every refusal is INVALID_ARGUMENT with a message that is valid UTF-8: the daemon forwards
// these messages to clients in protobuf strings, which must hold valid UTF-8.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engines/dense_model.h"
#include "engines/safetensors.h"
#include "fuzz/fuzz_check.h"

namespace {

using namespace warmpool;

int g_file = -1;
std::string g_path;

bool ValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    auto c = static_cast<unsigned char>(text[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; k < n; k++) {
      auto cc = static_cast<unsigned char>(text[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = cp << 6 | (cc & 0x3F);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n;
  }
  return true;
}

void CheckRefusal(const Status& status) {
  FUZZ_CHECK(!status.ok());
  FUZZ_CHECK(status.code() == Code::kInvalidArgument);
  FUZZ_CHECK(ValidUtf8(status.message()));
}

void CheckModel(const safetensors::Header& header) {
  Result<dense::DenseModel> model = dense::DescribeModel(header, "fuzz");
  if (!model.ok()) {
    CheckRefusal(model.status());
    return;
  }
  FUZZ_CHECK(!model->layers.empty());
  FUZZ_CHECK(model->in_features == model->layers.front().in_features);
  FUZZ_CHECK(model->out_features == model->layers.back().out_features);
  for (size_t i = 0; i < model->layers.size(); i++) {
    const dense::LinearLayer& layer = model->layers[i];
    FUZZ_CHECK(layer.in_features > 0 && layer.out_features > 0);
    if (i > 0) FUZZ_CHECK(model->layers[i - 1].out_features == layer.in_features);
    if (layer.bias) FUZZ_CHECK(layer.bias->shape.size() == 1 && layer.bias->shape[0] == layer.out_features);
  }
  dense::ScratchSizes scratch = dense::ScratchFor(*model);
  (void)dense::WorkspaceBytes(scratch);
}

void CheckHeader(const safetensors::Header& header, uint64_t file_size) {
  FUZZ_CHECK(header.file_size == file_size);
  FUZZ_CHECK(header.data_offset == 8 + header.header_len);
  FUZZ_CHECK(header.header_len > 0 && header.header_len <= safetensors::kMaxHeaderBytes);
  FUZZ_CHECK(header.data_offset <= file_size);
  // The tensors tile the data area exactly, in order.
  uint64_t cursor = 0;
  for (const safetensors::TensorInfo& tensor : header.tensors) {
    FUZZ_CHECK(tensor.begin == cursor);
    FUZZ_CHECK(tensor.end >= tensor.begin);
    FUZZ_CHECK(tensor.bytes() == tensor.numel() * safetensors::DTypeSize(tensor.dtype));
    FUZZ_CHECK(header.Find(tensor.name) != nullptr);
    cursor = tensor.end;
  }
  FUZZ_CHECK(cursor == file_size - header.data_offset);
  FUZZ_CHECK(header.data_bytes == cursor);
  CheckModel(header);
}

Result<safetensors::Header> Parse(std::span<const uint8_t> prefix, uint64_t file_size) {
  // A copy of exactly the bytes given, so that AddressSanitizer sees any read past them.
  std::vector<uint8_t> exact(prefix.begin(), prefix.end());
  Result<safetensors::Header> header = safetensors::ParseHeader(exact, file_size, "fuzz");
  if (header.ok()) {
    CheckHeader(*header, file_size);
  } else {
    CheckRefusal(header.status());
  }
  return header;
}

// 8 + header length + the largest data offset end in the header, when all of that is readable.
bool ImpliedFileSize(std::span<const uint8_t> input, uint64_t& file_size) {
  if (input.size() < 8) return false;
  uint64_t header_len = 0;
  std::memcpy(&header_len, input.data(), 8);
  if (header_len == 0 || header_len > input.size() - 8) return false;
  const auto* text = reinterpret_cast<const char*>(input.data() + 8);
  nlohmann::json root = nlohmann::json::parse(text, text + header_len, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) return false;
  uint64_t largest = 0;
  for (const auto& [name, entry] : root.items()) {
    if (!entry.is_object()) continue;
    auto offsets = entry.find("data_offsets");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2) continue;
    if (!(*offsets)[1].is_number_unsigned()) continue;
    largest = std::max(largest, (*offsets)[1].get<uint64_t>());
  }
  if (largest > UINT64_MAX - 8 - header_len) return false;
  file_size = 8 + header_len + largest;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char path[] = "/dev/shm/fuzz_safetensors.XXXXXX";
  g_file = mkostemp(path, O_CLOEXEC);
  if (g_file >= 0) {
    g_path = path;
    std::atexit([] { unlink(g_path.c_str()); });
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> input(data, size);

  // 1. In memory.
  Result<safetensors::Header> in_memory = Parse(input, size);

  // 2. The same bytes as a file.
  if (g_file >= 0 && ftruncate(g_file, 0) == 0 &&
      pwrite(g_file, data, size, 0) == static_cast<ssize_t>(size)) {
    std::vector<uint8_t> raw;
    Result<safetensors::Header> from_file = safetensors::ReadHeader(g_path, &raw);
    FUZZ_CHECK(from_file.ok() == in_memory.ok());
    if (from_file.ok()) {
      FUZZ_CHECK(from_file->data_offset == in_memory->data_offset);
      FUZZ_CHECK(from_file->tensors.size() == in_memory->tensors.size());
      FUZZ_CHECK(raw.size() == from_file->data_offset);
      FUZZ_CHECK(std::memcmp(raw.data(), data, raw.size()) == 0);
      // The raw header is what an attach describes the model from later: it parses the same.
      Result<safetensors::Header> again = safetensors::ParseHeader(raw, size, "raw");
      FUZZ_CHECK(again.ok() && again->tensors.size() == from_file->tensors.size());
    } else {
      CheckRefusal(from_file.status());
    }
  }

  // 3. Only part of the file read.
  (void)Parse(input.first(size / 2), size);

  // 4. A larger file of which only the header was read.
  uint64_t implied = 0;
  if (ImpliedFileSize(input, implied) && implied != size) {
    uint64_t header_end = 8;
    std::memcpy(&header_end, data, 8);
    header_end += 8;
    (void)Parse(input.first(header_end), implied);
  }
  return 0;
}
