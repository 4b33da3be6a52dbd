#include "engines/transformer/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "common/small_file.h"
#include "common/utf8.h"
#include "engines/json_describe.h"

namespace warmpool::transformer {
namespace {

using Json = nlohmann::json;

// config.json and the shard index are small; anything bigger is not one.
constexpr uint64_t kMaxJsonBytes = 16u << 20;

bool Exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

// The shard files named by model.safetensors.index.json, in the order first named. Each must be a
// plain file name inside the directory.
Result<std::vector<std::string>> ShardsOf(const std::string& index_path) {
  Result<std::string> text = ReadSmallFile(index_path, kMaxJsonBytes);
  if (!text.ok()) return text.status();
  Json index;
  try {
    index = Json::parse(*text);
  } catch (const Json::exception& e) {
    return Error(Code::kInvalidArgument, "\"{}\": not JSON: {}", index_path, e.what());
  }
  auto map = index.is_object() ? index.find("weight_map") : index.end();
  if (map == index.end() || !map->is_object() || map->empty()) {
    return Error(Code::kInvalidArgument, "\"{}\": no \"weight_map\" object naming the shards", index_path);
  }
  std::vector<std::string> files;
  std::set<std::string> seen;
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string()) return Error(Code::kInvalidArgument, "\"{}\": \"{}\" maps to {}", index_path, tensor, DescribeJson(file));
    const std::string name = file.get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      return Error(Code::kInvalidArgument, "\"{}\": shard \"{}\" is not a file name in the directory", index_path, name);
    }
    if (seen.insert(name).second) files.push_back(name);
  }
  return files;
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& directory) {
  Result<std::unique_ptr<Checkpoint>> opened = OpenDirectory(directory);
  if (!opened.ok()) return ValidUtf8(opened.status());
  return opened;
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::OpenDirectory(const std::string& directory) {
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  checkpoint->directory_ = directory;
  const std::string config_path = directory + "/config.json";
  Result<std::string> config_text = ReadSmallFile(config_path, kMaxJsonBytes);
  if (!config_text.ok()) return config_text.status();
  Result<Config> config = Config::Parse(*config_text, config_path);
  if (!config.ok()) return config.status();
  checkpoint->config_ = *config;

  const std::string single = directory + "/model.safetensors";
  const std::string index = directory + "/model.safetensors.index.json";
  if (Exists(index)) {
    Result<std::vector<std::string>> shards = ShardsOf(index);
    if (!shards.ok()) return shards.status();
    checkpoint->files_ = std::move(*shards);
  } else if (Exists(single)) {
    checkpoint->files_ = {"model.safetensors"};
  } else {
    return Error(Code::kNotFound, "\"{}\": neither model.safetensors nor model.safetensors.index.json", directory);
  }
  for (const std::string& file : checkpoint->files_) {
    if (Status mapped = checkpoint->MapFile(file); !mapped.ok()) return mapped;
  }
  return checkpoint;
}

Status Checkpoint::MapFile(const std::string& file) {
  const std::string path = directory_ + "/" + file;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return Status(CodeForErrno(err), fmt::format("\"{}\": cannot open: {}", path, std::strerror(err)));
  }
  Result<safetensors::Header> header = safetensors::ReadHeaderFrom(fd, path);
  if (!header.ok()) {
    close(fd);
    return header.status();
  }
  void* address = header->file_size == 0 ? nullptr : mmap(nullptr, header->file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  close(fd);  // the mapping keeps the file
  if (address == MAP_FAILED) {
    return Status(CodeForErrno(err), fmt::format("\"{}\": cannot map: {}", path, std::strerror(err)));
  }
  mappings_.push_back({address, header->file_size});
  const auto* data = static_cast<const uint8_t*>(address) + header->data_offset;
  for (const safetensors::TensorInfo& info : header->tensors) {
    TensorView view{info.name, info.dtype, info.shape, data + info.begin};
    if (!tensors_.emplace(info.name, std::move(view)).second) {
      return Error(Code::kInvalidArgument, "\"{}\": tensor \"{}\" is in more than one shard", path, info.name);
    }
    weight_bytes_ += info.bytes();
  }
  return OkStatus();
}

Checkpoint::~Checkpoint() {
  for (const Mapping& m : mappings_) {
    if (m.address != nullptr) munmap(m.address, m.size);
  }
}

}  // namespace warmpool::transformer
