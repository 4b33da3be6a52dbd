#include "engines/catalog/plugin_loader.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"

namespace warmpool {
namespace {

constexpr char kBuiltinNames[] = "dense, echo, transformer";

struct UnixError {
  int code;
  std::string text() const { return std::strerror(code); }
};

// realpath(3) into a std::string; errno kept in error.
bool RealPath(const std::string& path, std::string& out, UnixError& error) {
  char* resolved = realpath(path.c_str(), nullptr);
  if (resolved == nullptr) {
    error.code = errno;
    return false;
  }
  out = resolved;
  std::free(resolved);
  return true;
}

bool TrustedOwner(uid_t uid) { return uid == 0 || uid == geteuid(); }

std::string Octal(mode_t mode) { return fmt::format("{:04o}", static_cast<unsigned>(mode & 07777)); }

// A directory anyone but root and us may write to lets them swap the plugin under us.
Status CheckDirectory(const std::string& dir, std::string_view what) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    return Error(Code::kFailedPrecondition, "{} \"{}\": cannot stat: {}", what, dir, std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) return Error(Code::kFailedPrecondition, "{} \"{}\" is not a directory", what, dir);
  if (!TrustedOwner(st.st_uid)) {
    return Error(Code::kFailedPrecondition,
                 "{} \"{}\" is owned by uid {}, not by root or by the user warmpool runs as (uid {}); "
                 "plugins load only from a directory that no one else controls: chown it",
                 what, dir, st.st_uid, geteuid());
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return Error(Code::kFailedPrecondition,
                 "{} \"{}\" is writable by group or others (mode {}); plugins load only from a "
                 "directory that no one else may write to: chmod go-w it",
                 what, dir, Octal(st.st_mode));
  }
  return OkStatus();
}

// The plugin file itself, from a stat of the resolved path or of an open descriptor.
Status CheckPluginStat(const struct stat& st, const std::string& path) {
  if (!S_ISREG(st.st_mode)) {
    return Error(Code::kFailedPrecondition, "engine plugin \"{}\" is not a regular file", path);
  }
  if (!TrustedOwner(st.st_uid)) {
    return Error(Code::kFailedPrecondition,
                 "engine plugin \"{}\" is owned by uid {}, not by root or by the user warmpool runs as "
                 "(uid {}); refusing to load code someone else controls: chown it",
                 path, st.st_uid, geteuid());
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return Error(Code::kFailedPrecondition,
                 "engine plugin \"{}\" is writable by group or others (mode {}); refusing to load code "
                 "someone else may change: chmod go-w it",
                 path, Octal(st.st_mode));
  }
  return OkStatus();
}

struct LoadedPlugin {
  void* handle = nullptr;  // never dlclosed: engines and their vtables point into it
  const wp_engine_vtable* vtable = nullptr;
};

std::mutex& CacheMutex() {
  static std::mutex mutex;
  return mutex;
}

std::map<std::string, LoadedPlugin>& Cache() {
  static auto* cache = new std::map<std::string, LoadedPlugin>();  // outlives every engine
  return *cache;
}

// dlopen, look up the entry point, call it, check the vtable. The caller holds the cache mutex.
Result<LoadedPlugin> LoadPlugin(std::string_view name, const std::string& path) {
  // Check the file once more through a descriptor that cannot follow a symlink planted since.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return Error(Code::kFailedPrecondition, "engine plugin \"{}\": cannot open: {}", path, std::strerror(errno));
  }
  struct stat st {};
  Status checked = fstat(fd, &st) == 0
                       ? CheckPluginStat(st, path)
                       : Error(Code::kFailedPrecondition, "engine plugin \"{}\": cannot stat: {}", path,
                               std::strerror(errno));
  close(fd);
  if (!checked.ok()) return checked;

  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return Error(Code::kFailedPrecondition,
                 "engine plugin \"{}\" cannot be loaded: {}; build it as a shared object for this "
                 "machine with every dependency installed",
                 path, why != nullptr ? why : "unknown dlopen error");
  }
  auto fail = [&](Status status) -> Result<LoadedPlugin> {
    dlclose(handle);  // nothing from it is in use yet
    return status;
  };
  dlerror();
  void* symbol = dlsym(handle, kPluginEntrySymbol);
  if (symbol == nullptr) {
    return fail(Error(Code::kFailedPrecondition,
                      "engine plugin \"{}\" does not export {}(); a plugin defines extern \"C\" const "
                      "wp_engine_vtable* {}(void) (see warmpool/engine.h)",
                      path, kPluginEntrySymbol, kPluginEntrySymbol));
  }
  using EntryFn = const wp_engine_vtable* (*)();
  const wp_engine_vtable* vtable = reinterpret_cast<EntryFn>(symbol)();
  if (Status s = CheckEngineVtable(vtable, name, path); !s.ok()) return fail(s);
  return LoadedPlugin{handle, vtable};
}

}  // namespace

Status CheckEngineName(std::string_view name) {
  bool ok = !name.empty() && name.size() <= kMaxEngineNameBytes;
  for (char c : name) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-');
  if (!ok) {
    return Error(Code::kInvalidArgument,
                 "engine name \"{}\" must be 1 to {} characters of lower-case letters, digits, '_' or '-'",
                 name, kMaxEngineNameBytes);
  }
  return OkStatus();
}

Result<EngineSource> CheckEngine(std::string_view name, const std::string& engine_dir) {
  if (Status s = CheckEngineName(name); !s.ok()) return s;
  if (FindBuiltinEngine(name) != nullptr) return EngineSource{true, {}};
  const std::string file = std::string(name) + ".so";
  if (engine_dir.empty()) {
    return Error(Code::kNotFound,
                 "engine \"{}\" not found: no built-in engine of that name (built in: {}) and no engine "
                 "directory configured; put {} in a directory and set [daemon] engine_dir to it",
                 name, kBuiltinNames, file);
  }
  std::string dir;
  UnixError error{};
  if (!RealPath(engine_dir, dir, error)) {
    return Status(error.code == ENOENT ? Code::kNotFound : Code::kFailedPrecondition,
                  fmt::format("engine \"{}\" not found: engine directory \"{}\" (engine_dir) cannot be "
                              "opened: {}; create it or fix [daemon] engine_dir",
                              name, engine_dir, error.text()));
  }
  if (Status s = CheckDirectory(dir, "engine directory"); !s.ok()) return s;

  const std::string candidate = dir + "/" + file;
  struct stat link {};
  if (lstat(candidate.c_str(), &link) != 0) {
    if (errno == ENOENT) {
      return Error(Code::kNotFound,
                   "engine \"{}\" not found: no built-in engine of that name (built in: {}) and no {} in {}",
                   name, kBuiltinNames, file, dir);
    }
    return Error(Code::kFailedPrecondition, "engine plugin \"{}\": cannot stat: {}", candidate,
                 std::strerror(errno));
  }
  std::string resolved;
  if (!RealPath(candidate, resolved, error)) {
    return Status(error.code == ENOENT ? Code::kNotFound : Code::kFailedPrecondition,
                  fmt::format("engine plugin \"{}\" cannot be resolved: {}{}", candidate, error.text(),
                              S_ISLNK(link.st_mode) ? " (a symlink to a missing file?)" : ""));
  }
  if (resolved.size() <= dir.size() + 1 || resolved.compare(0, dir.size(), dir) != 0 ||
      (dir != "/" && resolved[dir.size()] != '/')) {
    return Error(Code::kFailedPrecondition,
                 "engine plugin \"{}\" resolves to \"{}\", outside the engine directory \"{}\"; plugins "
                 "load only from inside engine_dir: copy the file there instead of linking to it",
                 candidate, resolved, dir);
  }
  struct stat st {};
  if (stat(resolved.c_str(), &st) != 0) {
    return Error(Code::kFailedPrecondition, "engine plugin \"{}\": cannot stat: {}", resolved,
                 std::strerror(errno));
  }
  if (Status s = CheckPluginStat(st, resolved); !s.ok()) return s;
  // A symlink may lead into a subdirectory: every directory between engine_dir and the file counts.
  for (std::string parent = resolved.substr(0, resolved.rfind('/')); parent.size() > dir.size();
       parent.resize(parent.rfind('/'))) {
    if (Status s = CheckDirectory(parent, "engine plugin directory"); !s.ok()) return s;
  }
  return EngineSource{false, resolved};
}

Status CheckEngineVtable(const wp_engine_vtable* vtable, std::string_view expected_name,
                         std::string_view source) {
  if (vtable == nullptr) {
    return Error(Code::kFailedPrecondition, "engine plugin \"{}\": {}() returned no vtable", source,
                 kPluginEntrySymbol);
  }
  if (vtable->abi_version < WP_ENGINE_ABI_VERSION_MIN || vtable->abi_version > WP_ENGINE_ABI_VERSION) {
    return Error(Code::kFailedPrecondition,
                 "engine plugin \"{}\" implements engine ABI version {}, this warmpool loads {} to {}; "
                 "rebuild it against this warmpool's warmpool/engine.h",
                 source, vtable->abi_version, WP_ENGINE_ABI_VERSION_MIN, WP_ENGINE_ABI_VERSION);
  }
  if (vtable->open == nullptr || vtable->load == nullptr || vtable->infer == nullptr ||
      vtable->close == nullptr || vtable->export_weights == nullptr || vtable->attach == nullptr) {
    return Error(Code::kFailedPrecondition,
                 "engine plugin \"{}\" leaves an entry point of its vtable empty; every one of open, load, "
                 "infer, close, export_weights and attach is required",
                 source);
  }
  if (vtable->abi_version >= 7) {
    const int sequence_calls = (vtable->open_sequence != nullptr) + (vtable->step != nullptr) +
                               (vtable->close_sequence != nullptr);
    if (sequence_calls != 0 && sequence_calls != 3) {
      return Error(Code::kFailedPrecondition,
                   "engine plugin \"{}\" gives some of open_sequence, step and close_sequence but not all: "
                   "give the three or none",
                   source);
    }
  }
  if (!expected_name.empty() && (vtable->name == nullptr || expected_name != vtable->name)) {
    return Error(Code::kFailedPrecondition,
                 "engine plugin \"{}\" calls itself \"{}\", not \"{}\"; name the file after the engine "
                 "(<name>.so)",
                 source, vtable->name != nullptr ? vtable->name : "", expected_name);
  }
  return OkStatus();
}

Result<const wp_engine_vtable*> ResolveEngine(std::string_view name, const std::string& engine_dir) {
  if (Status s = CheckEngineName(name); !s.ok()) return s;
  if (const wp_engine_vtable* builtin = FindBuiltinEngine(name); builtin != nullptr) return builtin;
  std::string key = engine_dir;
  key.push_back('\0');
  key.append(name);
  std::lock_guard lock(CacheMutex());
  if (auto it = Cache().find(key); it != Cache().end()) return it->second.vtable;
  Result<EngineSource> source = CheckEngine(name, engine_dir);
  if (!source.ok()) return source.status();
  Result<LoadedPlugin> plugin = LoadPlugin(name, source->plugin_path);
  if (!plugin.ok()) return plugin.status();
  Cache().emplace(std::move(key), *plugin);
  return plugin->vtable;
}

}  // namespace warmpool
