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

// The pooling modes sentence-transformers' Pooling module knows but the last token's, as its
// config.json names them: one boolean each (before version 5.4), or one "pooling_mode" string (or
// list of them) since.
constexpr const char* kOtherPoolings[] = {"pooling_mode_cls_token", "pooling_mode_mean_tokens",
                                          "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                          "pooling_mode_weightedmean_tokens"};

// Whether Python takes the value as true, as sentence-transformers reads its flags: not None,
// False, 0 or an empty string, list or object.
bool Truthy(const Json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
  return true;
}

// A module's class by the last part of its type: "sentence_transformers.models.Pooling" before
// version 5.4, "sentence_transformers.sentence_transformer.modules.pooling.Pooling" since.
std::string ModuleClass(const std::string& type) {
  if (!type.starts_with("sentence_transformers.")) return "";
  return type.substr(type.rfind('.') + 1);
}

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
Status CheckPooling(int dir, std::string folder, const std::string& shown, std::vector<FileVersion>* versions) {
  if (folder.ends_with('/')) folder.pop_back();  // os.path.join takes "1_Pooling/" too
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
  auto wrongly = [&](const std::string& what) {
    return Error(Code::kInvalidArgument,
                 "\"{}\": {}: warmpool embeds by the last token's state alone (pooling_mode_lasttoken), so this "
                 "model would embed wrongly",
                 path, what);
  };
  if (auto mode = config->find("pooling_mode"); mode != config->end() && !mode->is_null()) {
    // Since 5.4: a name, or a list of names whose outputs are joined.
    const bool last = (mode->is_string() && *mode == "lasttoken") ||
                      (mode->is_array() && mode->size() == 1 && (*mode)[0] == "lasttoken");
    if (!last) return wrongly("pooling_mode is " + mode->dump());
    return OkStatus();
  }
  for (const char* key : kOtherPoolings) {
    auto it = config->find(key);
    if (it != config->end() && Truthy(*it)) return wrongly(fmt::format("{} is {}", key, it->dump()));
  }
  auto last = config->find("pooling_mode_lasttoken");
  if (last == config->end() || !Truthy(*last)) {
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
  bool pooled = false;
  for (size_t i = 0; i < modules->size(); ++i) {
    const Json& m = (*modules)[i];
    if (!m.is_object() || !m.contains("type") || !m["type"].is_string()) {
      return Error(Code::kInvalidArgument, "\"{}\": module {} has no \"type\"", path, i);
    }
    const std::string type = m["type"].get<std::string>();
    const std::string module = ModuleClass(type);
    const std::string folder = m.contains("path") && m["path"].is_string() ? m["path"].get<std::string>() : "";
    if (module == "Transformer" || module == "Normalize") {
      continue;  // the model itself; unit length, as warmpool's embeddings always are
    }
    if (module == "Pooling") {
      if (Status s = CheckPooling(dir, folder, shown, versions); !s.ok()) return s;
      pooled = true;
      continue;
    }
    return Error(Code::kInvalidArgument,
                 "\"{}\": module {} is {}, which warmpool does not compute (it embeds by the Transformer, "
                 "last-token Pooling and Normalize modules alone)",
                 path, i, type);
  }
  if (!pooled) {
    return Error(Code::kInvalidArgument,
                 "\"{}\": no Pooling module, so no embedding of a whole input (warmpool pools by the last token)", path);
  }
  return OkStatus();
}

}  // namespace warmpool::transformer
