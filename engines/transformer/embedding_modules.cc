#include "engines/transformer/embedding_modules.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/small_file.h"

namespace warmpool::transformer {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxModulesBytes = 1u << 20;

// The pooling modes sentence-transformers' Pooling module knows, but the last token's.
constexpr const char* kOtherPoolings[] = {"pooling_mode_cls_token", "pooling_mode_mean_tokens",
                                          "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                          "pooling_mode_weightedmean_tokens"};

Result<Json> ReadJson(int dir, const std::string& name, const std::string& path, std::vector<FileVersion>* versions) {
  FileVersion version;
  Result<std::string> text = ReadSmallFileAt(dir, name, kMaxModulesBytes, path, &version);
  if (!text.ok()) return text.status();
  if (versions != nullptr) versions->push_back(version);
  Json json = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Error(Code::kInvalidArgument, "\"{}\": not JSON", path);
  return json;
}

// The Pooling module's folder (one path component, not followed through a symlink), its
// config.json checked: the last token's pooling, and no other.
Status CheckPooling(int dir, const std::string& folder, const std::string& shown, std::vector<FileVersion>* versions) {
  const std::string path = shown + "/" + folder + "/config.json";
  if (folder.empty() || folder == "." || folder == ".." || folder.find('/') != std::string::npos) {
    return Error(Code::kInvalidArgument, "\"{}/modules.json\": the Pooling module's path \"{}\" is not a folder of the directory",
                 shown, folder);
  }
  const int sub = openat(dir, folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sub < 0) {
    const int err = errno;
    return Error(Code::kInvalidArgument, "\"{}/{}\": {}", shown, folder,
                 err == ELOOP || err == ENOTDIR ? "not a folder (a symlink is not followed)" : std::strerror(err));
  }
  Result<Json> config = ReadJson(sub, "config.json", path, versions);
  close(sub);
  if (!config.ok()) return config.status();
  if (!config->is_object()) return Error(Code::kInvalidArgument, "\"{}\": not a JSON object", path);
  for (const char* key : kOtherPoolings) {
    auto it = config->find(key);
    if (it != config->end() && it->is_boolean() && it->get<bool>()) {
      return Error(Code::kInvalidArgument,
                   "\"{}\": {} is true: warmpool embeds by the last token's state alone "
                   "(pooling_mode_lasttoken), so this model would embed wrongly",
                   path, key);
    }
  }
  auto last = config->find("pooling_mode_lasttoken");
  if (last == config->end() || !last->is_boolean() || !last->get<bool>()) {
    return Error(Code::kInvalidArgument, "\"{}\": pooling_mode_lasttoken is not true: warmpool pools no other way", path);
  }
  return OkStatus();
}

}  // namespace

Status CheckEmbeddingModules(int dir, const std::string& shown, std::vector<FileVersion>* versions) {
  const std::string path = shown + "/modules.json";
  Result<Json> modules = ReadJson(dir, "modules.json", path, versions);
  if (!modules.ok()) return modules.status().code() == Code::kNotFound ? OkStatus() : modules.status();
  if (!modules->is_array()) return Error(Code::kInvalidArgument, "\"{}\": not a JSON array of modules", path);
  for (size_t i = 0; i < modules->size(); ++i) {
    const Json& m = (*modules)[i];
    if (!m.is_object() || !m.contains("type") || !m["type"].is_string()) {
      return Error(Code::kInvalidArgument, "\"{}\": module {} has no \"type\"", path, i);
    }
    const std::string type = m["type"].get<std::string>();
    const std::string folder = m.contains("path") && m["path"].is_string() ? m["path"].get<std::string>() : "";
    if (type == "sentence_transformers.models.Transformer" || type == "sentence_transformers.models.Normalize") {
      continue;  // the model itself; unit length, as warmpool's embeddings always are
    }
    if (type == "sentence_transformers.models.Pooling") {
      if (Status s = CheckPooling(dir, folder, shown, versions); !s.ok()) return s;
      continue;
    }
    return Error(Code::kInvalidArgument,
                 "\"{}\": module {} is {}, which warmpool does not compute (it embeds by the Transformer, "
                 "last-token Pooling and Normalize modules alone)",
                 path, i, type);
  }
  return OkStatus();
}

}  // namespace warmpool::transformer
