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

// A symlink exists too: reading it then says why it is refused.
bool Exists(int dir, const char* name) {
  struct stat st {};
  return fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

// The shard files named by model.safetensors.index.json, in the order first named. Each must be a
// plain file name inside the directory.
Result<std::vector<std::string>> ShardsOf(const std::string& text, const std::string& index_path) {
  Json index;
  try {
    index = Json::parse(text);
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
  const int dir = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    const int err = errno;
    return ValidUtf8(Status(CodeForErrno(err), fmt::format("\"{}\": {}", directory, std::strerror(err))));
  }
  Result<std::unique_ptr<Checkpoint>> opened = OpenAt(dir, directory);
  close(dir);
  return opened;
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::OpenAt(int dir, const std::string& shown) {
  Result<std::unique_ptr<Checkpoint>> opened = OpenDirectory(dir, shown);
  if (!opened.ok()) return ValidUtf8(opened.status());
  return opened;
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::OpenDirectory(int dir, const std::string& directory) {
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  checkpoint->directory_ = directory;
  const std::string config_path = directory + "/config.json";
  FileVersion version;
  Result<std::string> config_text = ReadSmallFileAt(dir, "config.json", kMaxJsonBytes, config_path, &version);
  if (!config_text.ok()) return config_text.status();
  checkpoint->versions_.push_back(version);
  Result<Config> config = Config::Parse(*config_text, config_path);
  if (!config.ok()) return config.status();
  checkpoint->config_ = *config;
  checkpoint->config_text_ = std::move(*config_text);

  if (Exists(dir, "model.safetensors.index.json")) {
    const std::string index = directory + "/model.safetensors.index.json";
    Result<std::string> text = ReadSmallFileAt(dir, "model.safetensors.index.json", kMaxJsonBytes, index, &version);
    if (!text.ok()) return text.status();
    checkpoint->versions_.push_back(version);
    Result<std::vector<std::string>> shards = ShardsOf(*text, index);
    if (!shards.ok()) return shards.status();
    checkpoint->files_ = std::move(*shards);
  } else if (Exists(dir, "model.safetensors")) {
    checkpoint->files_ = {"model.safetensors"};
  } else {
    return Error(Code::kNotFound, "\"{}\": neither model.safetensors nor model.safetensors.index.json", directory);
  }
  for (const std::string& file : checkpoint->files_) {
    if (Status mapped = checkpoint->MapFile(dir, file); !mapped.ok()) return mapped;
  }
  return checkpoint;
}

Status Checkpoint::MapFile(int dir, const std::string& file) {
  const std::string path = directory_ + "/" + file;
  Result<int> opened = OpenFileAt(dir, file, path);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return Status(CodeForErrno(err), fmt::format("\"{}\": {}", path, std::strerror(err)));
  }
  versions_.push_back(FileVersionOf(st));
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
    TensorView view{info.name, info.dtype, info.shape, data + info.begin,
                    static_cast<uint32_t>(mappings_.size() - 1), header->data_offset + info.begin,
                    info.bytes()};
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
