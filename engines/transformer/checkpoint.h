// A Hugging Face checkpoint directory, opened for reading: config.json, and the weights in
// model.safetensors or in shards listed by model.safetensors.index.json. Every weights file is
// mapped read-only and its header checked (engines/safetensors.h) before a tensor is handed out.
// Tokenizer and generation files are not read here.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/file_version.h"
#include "common/status.h"
#include "engines/safetensors.h"
#include "engines/transformer/config.h"

namespace warmpool::transformer {

// One tensor where it lies in a mapped file: [shape] of dtype, row-major, little-endian.
struct TensorView {
  std::string name;
  safetensors::DType dtype = safetensors::DType::F32;
  std::vector<uint64_t> shape;
  const uint8_t* data = nullptr;
  uint32_t file = 0;         // in Checkpoint::files()
  uint64_t file_offset = 0;  // of its first byte in that file
  uint64_t bytes = 0;
};

class Checkpoint {
 public:
  // Reads config.json and maps the weights. Errors name the file and what is wrong with it (in
  // valid UTF-8, whatever the path or the files hold).
  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& directory);
  // The same through the directory held open as `dir` (the caller keeps it): every file is opened
  // beneath it, following no symlink; `shown` names the directory in messages.
  static Result<std::unique_ptr<Checkpoint>> OpenAt(int dir, const std::string& shown);
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const Config& config() const { return config_; }
  const std::string& directory() const { return directory_; }
  // Every tensor of every weights file, by name.
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // The weights files, as named in the directory (one, or the shards in order).
  const std::vector<std::string>& files() const { return files_; }
  uint64_t weight_bytes() const { return weight_bytes_; }
  // config.json as read (the model's description carries it: engines/transformer/packed_model.h).
  const std::string& config_text() const { return config_text_; }
  // Of every file read: config.json, the shard index when there is one, the weights files.
  const std::vector<FileVersion>& versions() const { return versions_; }

 private:
  Checkpoint() = default;
  static Result<std::unique_ptr<Checkpoint>> OpenDirectory(int dir, const std::string& directory);
  Status MapFile(int dir, const std::string& file);

  struct Mapping {
    void* address = nullptr;
    uint64_t size = 0;
  };
  std::string directory_;
  Config config_;
  std::string config_text_;
  std::vector<FileVersion> versions_;
  std::vector<std::string> files_;
  std::vector<Mapping> mappings_;
  std::map<std::string, TensorView> tensors_;
  uint64_t weight_bytes_ = 0;
};

}  // namespace warmpool::transformer
