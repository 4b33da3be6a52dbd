#include "common/file_version.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace warmpool {

namespace {

uint64_t Nanos(const timespec& t) {
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

}  // namespace

FileVersion FileVersionOf(const struct stat& st) {
  return FileVersion{static_cast<uint64_t>(st.st_size), Nanos(st.st_mtim), static_cast<uint64_t>(st.st_ino),
                     static_cast<uint64_t>(st.st_dev), Nanos(st.st_ctim)};
}

namespace {

using NamedVersions = std::vector<std::pair<std::string, FileVersion>>;

// Whether a subdirectory is a sentence-transformers module's folder as that library names them:
// its index, "_", its type ("1_Pooling", "2_Normalize"). Only those are looked into: not a
// checkpoint's other trees (original/, onnx/, a trainer's checkpoint-500/), whose files the model
// is not made of and which tools may write into while it serves.
bool IsModuleFolder(std::string_view name) {
  size_t digits = 0;
  while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') digits++;
  return digits > 0 && digits + 1 < name.size() && name[digits] == '_';
}

// The files of `dir` a model is made of, named `prefix` + their name: its JSON files and its
// weights (not a README, a lock, a log). With `descend`, the JSON files of its module folders too
// (IsModuleFolder; not their subdirectories): a sentence-transformers Pooling module's
// configuration (1_Pooling/config.json) is what the model embeds by. False when `dir` cannot be
// listed.
bool AddModelFiles(int dir, const std::string& prefix, bool descend, NamedVersions& files) {
  const int copy = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // its own offset
  DIR* listing = copy >= 0 ? fdopendir(copy) : nullptr;
  if (listing == nullptr) {
    if (copy >= 0) close(copy);
    return false;
  }
  std::vector<std::string> subdirectories;
  while (const dirent* entry = readdir(listing)) {
    const std::string_view name = entry->d_name;
    const bool model_file = name.ends_with(".json") || (prefix.empty() && name.ends_with(".safetensors"));
    const bool module_folder = descend && IsModuleFolder(name);
    if (!model_file && !module_folder) continue;
    struct stat st {};
    if (fstatat(dir, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      if (module_folder) subdirectories.emplace_back(name);
    } else if (model_file && (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode))) {
      files.emplace_back(prefix + entry->d_name, FileVersionOf(st));
    }
  }
  closedir(listing);
  for (const std::string& name : subdirectories) {
    // Not followed through a symlink (O_NOFOLLOW), as the model's files are not (model_roots.h).
    const int sub = openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) continue;
    AddModelFiles(sub, prefix + name + "/", /*descend=*/false, files);
    close(sub);
  }
  return true;
}

}  // namespace

FileVersion DirectoryVersion(int dir) {
  struct stat self {};
  if (fstat(dir, &self) != 0 || !S_ISDIR(self.st_mode)) return {};
  NamedVersions files;
  if (!AddModelFiles(dir, "", /*descend=*/true, files)) return {};
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Sizes add up and times take the latest; the identity mixes every file's name and version in
  // (FNV-1a over the bytes), so that any file replaced, added or removed changes it.
  FileVersion folded{0, 0, 0, static_cast<uint64_t>(self.st_dev), 0};
  uint64_t hash = 0xcbf29ce484222325ull;
  auto mix = [&hash](const void* data, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) {
      hash ^= static_cast<const unsigned char*>(data)[i];
      hash *= 0x100000001b3ull;
    }
  };
  for (const auto& [name, version] : files) {
    folded.size += version.size;
    folded.mtime_ns = std::max(folded.mtime_ns, version.mtime_ns);
    folded.ctime_ns = std::max(folded.ctime_ns, version.ctime_ns);
    mix(name.data(), name.size() + 1);
    const uint64_t fields[] = {version.size, version.mtime_ns, version.inode, version.device, version.ctime_ns};
    mix(fields, sizeof(fields));
  }
  folded.inode = hash;
  return folded;
}

}  // namespace warmpool
