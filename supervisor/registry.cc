#include "supervisor/registry.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>
#include <system_error>

#include "engines/builtin.h"
#include "engines/dense_model.h"
#include "engines/catalog/plugin_loader.h"
#include "common/utf8.h"
#include "engines/safetensors.h"
#include "engines/chat_template/tool_calls.h"
#include "engines/transformer/model_directory.h"
#include "engines/transformer/packed_model.h"

namespace warmpool::supervisor {

namespace fs = std::filesystem;

namespace {

ModelEntry Refused(const std::string& name, const std::string& engine, const std::string& path,
                   const Status& why) {
  ModelEntry entry;
  entry.name = name;
  entry.engine = engine;
  entry.path = path;
  entry.problem = why;
  entry.path_refused = true;
  entry.file_missing = why.code() == Code::kNotFound;
  entry.problem_in_file = entry.file_missing;  // putting the file back is what helps
  return entry;
}

// A Hugging Face model directory: served by the transformer engine, described by it (config, weights
// headers, tokenizer) with no weight read.
template <typename CheckEngine>
ModelEntry InspectDirectory(ModelEntry entry, const ModelFile& directory, const CheckEngine& check_engine,
                            Backend backend) {
  if (entry.engine.empty()) entry.engine = "transformer";
  if (!check_engine(entry)) return entry;
  struct stat config {};
  if (fstatat(directory.fd(), "config.json", &config, AT_SYMLINK_NOFOLLOW) != 0) {
    entry.problem = Error(Code::kInvalidArgument,
                          "model \"{}\": {} is a directory without a config.json: not a model directory (a "
                          "Hugging Face checkpoint)",
                          entry.name, entry.path);
    entry.problem_in_file = true;
    return entry;
  }
  if (entry.engine != "transformer") {
    entry.problem = Error(Code::kInvalidArgument,
                          "model \"{}\": {} is a directory, which the transformer engine serves, not \"{}\"",
                          entry.name, entry.path, entry.engine);
    return entry;
  }
  Result<transformer::PackedModel> packed = transformer::DescribeDirectory(directory.fd(), entry.path);
  if (!packed.ok()) {
    entry.problem = packed.status();
    entry.problem_in_file = true;
    return entry;
  }
  entry.header = transformer::EncodeHeader(*packed);
  entry.file_size = entry.version.size;
  entry.weight_bytes = packed->region_bytes;
  entry.context = transformer::ServedContext(packed->config, 0);
  entry.sequences = transformer::ServedSequences(0);  // [[models]] parallel changes it (Core::ApplySettings)
  // The KV cache's element and the workspace as the engine will have them where it runs (a worker's
  // load report says them again).
  const bool on_device = backend != Backend::kHost;
  packed->config.kv_element = transformer::ServedKvElement(*packed, on_device);
  entry.workspace_bytes = transformer::ServedWorkspaceBytes(packed->config, entry.context, entry.sequences, 0, on_device);
  entry.kv_bytes_per_token = packed->config.KvBytesPerToken();
  entry.embedding_size = packed->config.hidden_size;
  entry.embeds_only = !transformer::HasOutputHead(*packed);
  entry.tool_call_format = std::string(
      chat::ToolCallFormatName(chat::DetectToolCallFormat(transformer::ChatTemplateText(packed->texts.tokenizer_config))));
  if (entry.tool_call_format == "none") entry.tool_call_format.clear();
  return entry;
}

}  // namespace

ModelEntry InspectModel(const std::string& name, const std::string& engine, const std::string& path,
                        const ModelRoots& roots, const std::string& engine_dir, Backend backend) {
  if (Status s = CheckModelName(name); !s.ok()) {
    ModelEntry entry;
    entry.name = name;
    entry.engine = engine;
    entry.path = path;
    entry.problem = s;
    return entry;
  }
  // Built in, or a plugin file in engine_dir that passes the file checks. Never dlopen here: plugin
  // code runs in workers only. A plugin's workspace is unknown until a worker opens it (0 here);
  // the worker's load_done report corrects the account.
  auto check_engine = [&](ModelEntry& entry) {
    Result<EngineSource> source = CheckEngine(entry.engine, engine_dir);
    if (!source.ok()) {
      entry.problem = Status(source.status().code(),
                             fmt::format("model \"{}\": {}", name, source.status().message()));
      return false;
    }
    if (path.empty() && source->builtin && entry.engine != "echo") {
      entry.problem = Error(Code::kInvalidArgument, "model \"{}\" has no path", name);
      return false;
    }
    return true;
  };
  if (path.empty()) {
    ModelEntry entry;
    entry.name = name;
    entry.engine = engine.empty() ? "dense" : engine;
    check_engine(entry);
    return entry;
  }
  Result<ModelFile> file = roots.Open(path);
  if (!file.ok()) return Refused(name, engine.empty() ? "dense" : engine, path, file.status());
  ModelEntry entry;
  entry.name = name;
  entry.engine = engine;
  entry.path = file->path();
  entry.version = file->version();
  if (file->is_directory()) return InspectDirectory(std::move(entry), *file, check_engine, backend);
  std::vector<uint8_t> raw;
  Result<safetensors::Header> header = safetensors::ReadHeaderFrom(file->fd(), file->path(), &raw);
  if (entry.engine.empty()) {
    auto named = header.ok() ? header->metadata.find("engine") : std::map<std::string, std::string>::const_iterator{};
    entry.engine = header.ok() && named != header->metadata.end() ? named->second : "dense";
  }
  if (!check_engine(entry)) return entry;
  if (!header.ok()) {
    entry.problem = header.status();
    entry.problem_in_file = true;
    return entry;
  }
  entry.header.assign(raw.begin(), raw.end());
  entry.file_size = header->file_size;
  auto it = header->metadata.find("engine");
  if (it != header->metadata.end() && it->second != entry.engine) {
    entry.problem = Error(Code::kInvalidArgument,
                          "model file \"{}\" is for engine \"{}\" but is configured for \"{}\"",
                          entry.path, it->second, entry.engine);
    return entry;
  }
  entry.weight_bytes = header->data_bytes;
  if (entry.engine == "dense") {
    Result<dense::DenseModel> model = dense::DescribeModel(*header, entry.path);
    if (!model.ok()) {
      entry.problem = model.status();
      entry.problem_in_file = true;
      return entry;
    }
    entry.workspace_bytes = dense::WorkspaceBytes(dense::ScratchFor(*model));
    entry.in_features = model->in_features;
    entry.out_features = model->out_features;
  }
  return entry;
}

std::vector<ModelEntry> DiscoverModels(const Config& config, const ModelRoots& roots,
                                       std::vector<std::string>& warnings) {
  std::vector<ModelEntry> entries;
  std::set<std::string> names;
  for (const ModelConfig& m : config.models) {
    if (!names.insert(m.name).second) {
      warnings.push_back(fmt::format("model \"{}\" is configured twice; the first entry wins", m.name));
      continue;
    }
    entries.push_back(InspectModel(m.name, m.engine, m.path, roots, config.engine_dir, config.backend));
  }
  std::error_code ec;
  if (config.models_dir.empty() || !fs::is_directory(config.models_dir, ec)) {
    if (!config.models_dir.empty()) {
      warnings.push_back(fmt::format("models directory \"{}\" does not exist; only configured models "
                                     "are registered",
                                     config.models_dir));
    }
    return entries;
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(config.models_dir, ec)) {
    // Symlinks too (is_regular_file follows them): where they lead is checked against the roots.
    // A directory with a config.json is a Hugging Face model, registered by the directory's name.
    std::error_code ignored;
    if ((e.path().extension() == ".safetensors" && e.is_regular_file(ec)) ||
        (e.is_directory(ec) && fs::is_regular_file(e.path() / "config.json", ignored))) {
      files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    std::string name = file.extension() == ".safetensors" ? file.stem().string() : file.filename().string();
    if (Status s = CheckModelName(name); !s.ok()) {
      // Not registered at all, not even as failed: a file name is not necessarily UTF-8, and the
      // index's names travel in every status reply.
      warnings.push_back(fmt::format("{} skipped: its file name is not a model name (1 to 63 of "
                                     "A-Z a-z 0-9 . _ -, not starting with '.')",
                                     ValidUtf8(file.string())));
      continue;
    }
    if (!names.insert(name).second) {
      warnings.push_back(fmt::format("{} is shadowed by a configured model of the same name",
                                     file.string()));
      continue;
    }
    entries.push_back(InspectModel(name, /*engine=*/"", fs::absolute(file, ec).lexically_normal().string(),
                                   roots, config.engine_dir, config.backend));
    entries.back().from_models_dir = true;
  }
  return entries;
}

}  // namespace warmpool::supervisor
