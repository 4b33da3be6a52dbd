#include "supervisor/registry.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>
#include <system_error>

#include "engines/builtin.h"
#include "engines/dense_model.h"
#include "engines/plugin_loader.h"
#include "common/utf8.h"
#include "engines/safetensors.h"
#include "supervisor/model_roots.h"

namespace warmpool::supervisor {

namespace fs = std::filesystem;

ModelEntry InspectModel(const std::string& name, const std::string& engine,
                        const std::string& path, const std::string& engine_dir) {
  ModelEntry entry;
  entry.name = name;
  entry.engine = engine;
  entry.path = path;
  if (Status s = CheckModelName(name); !s.ok()) {
    entry.problem = s;
    return entry;
  }
  // Built in, or a plugin file in engine_dir that passes the file checks. Never dlopen here: plugin
  // code runs in workers only. A plugin's workspace is unknown until a worker opens it (0 here);
  // the worker's load_done report corrects the account.
  Result<EngineSource> source = CheckEngine(engine, engine_dir);
  if (!source.ok()) {
    entry.problem = Status(source.status().code(),
                           fmt::format("model \"{}\": {}", name, source.status().message()));
    return entry;
  }
  if (path.empty()) {
    if (source->builtin && engine != "echo") {
      entry.problem = Error(Code::kInvalidArgument, "model \"{}\" has no path", name);
    }
    return entry;
  }
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    auto ns = [](const timespec& t) { return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec); };
    entry.version = FileVersion{static_cast<uint64_t>(st.st_size), ns(st.st_mtim), static_cast<uint64_t>(st.st_ino),
                                static_cast<uint64_t>(st.st_dev), ns(st.st_ctim)};
  } else if (errno == ENOENT) {
    entry.file_missing = true;
  }
  std::vector<uint8_t> raw;
  Result<safetensors::Header> header = safetensors::ReadHeader(path, &raw);
  if (!header.ok()) {
    entry.problem = header.status();
    return entry;
  }
  entry.header.assign(raw.begin(), raw.end());
  entry.file_size = header->file_size;
  auto it = header->metadata.find("engine");
  if (it != header->metadata.end() && it->second != engine) {
    entry.problem = Error(Code::kInvalidArgument,
                          "model file \"{}\" is for engine \"{}\" but is configured for \"{}\"",
                          path, it->second, engine);
    return entry;
  }
  entry.weight_bytes = header->data_bytes;
  if (engine == "dense") {
    Result<dense::DenseModel> model = dense::DescribeModel(*header, path);
    if (!model.ok()) {
      entry.problem = model.status();
      return entry;
    }
    entry.workspace_bytes = dense::WorkspaceBytes(dense::ScratchFor(*model));
    entry.in_features = model->in_features;
    entry.out_features = model->out_features;
  }
  return entry;
}

std::string EngineNamedBy(const std::string& path) {
  if (Result<safetensors::Header> h = safetensors::ReadHeader(path); h.ok()) {
    if (auto it = h->metadata.find("engine"); it != h->metadata.end()) return it->second;
  }
  return "dense";
}

std::vector<ModelEntry> DiscoverModels(const Config& config, std::vector<std::string>& warnings) {
  const std::vector<std::string> roots = EffectiveModelRoots(config);
  // Every path is resolved under the model roots before anything reads it: a symlink or `..`
  // leading out of them registers the model as failed and the file is never opened. The
  // registered path is the resolved one, so a symlink switched to a new file is a changed model.
  auto inspect = [&](const std::string& name, std::string engine, const std::string& path,
                     bool engine_from_file) {
    if (path.empty()) return InspectModel(name, engine, path, config.engine_dir);  // echo
    Result<std::string> real = ResolveModelPath(path, roots);
    if (!real.ok()) {
      ModelEntry entry;
      entry.name = name;
      entry.engine = engine;
      entry.path = path;
      entry.problem = real.status();
      entry.path_refused = true;
      entry.file_missing = real.status().code() == Code::kNotFound;
      return entry;
    }
    if (engine_from_file) engine = EngineNamedBy(*real);
    return InspectModel(name, engine, *real, config.engine_dir);
  };
  std::vector<ModelEntry> entries;
  std::set<std::string> names;
  for (const ModelConfig& m : config.models) {
    if (!names.insert(m.name).second) {
      warnings.push_back(fmt::format("model \"{}\" is configured twice; the first entry wins", m.name));
      continue;
    }
    entries.push_back(inspect(m.name, m.engine, m.path, /*engine_from_file=*/false));
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
    if (e.path().extension() == ".safetensors" && e.is_regular_file(ec)) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    std::string name = file.stem().string();
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
    entries.push_back(inspect(name, "dense", fs::absolute(file, ec).lexically_normal().string(),
                              /*engine_from_file=*/true));
  }
  return entries;
}

}  // namespace warmpool::supervisor
