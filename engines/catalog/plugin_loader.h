// Engine plugins: engines built outside warmpool and loaded by workers from one configured directory.
//
// Writing a plugin
//   Include warmpool/engine.h (the C ABI; nothing else of warmpool is needed), implement every entry
//   point of wp_engine_vtable, and export one C symbol:
//
//       extern "C" const wp_engine_vtable* warmpool_engine(void);
//
//   returning a vtable with abi_version = WP_ENGINE_ABI_VERSION and name equal to the file's stem.
//   Build it as a shared object named <engine>.so, where <engine> is 1 to 63 characters of
//   [a-z0-9_-]. engines/plugins/scale/ is a complete example (see engines/plugins/README.md).
//
// Installing it
//   Set `[daemon] engine_dir = "/path/to/engines"` and put <engine>.so there; a model then names it
//   with `engine = "<engine>"`. A name that is built in ("dense", "echo", "transformer") always means the built-in
//   engine: a plugin file of that name is never loaded.
//
// What is checked before any plugin code runs (a hostile plugin file is the threat)
//   - the engine name: 1..63 of [a-z0-9_-], checked before the file system is touched;
//   - the file <engine_dir>/<engine>.so exists and, with every symlink resolved, lies inside the
//     resolved engine_dir (a symlink or ".." leading out of it is refused);
//   - it is a regular file, owned by root or by the user warmpool runs as, and not writable by group
//     or others;
//   - engine_dir, and every directory between it and the resolved file, is owned by root or that
//     user and not writable by group or others (else anyone who may write there could swap the file).
//   Workers re-check the file through a descriptor opened with O_NOFOLLOW, then dlopen the resolved
//   path (RTLD_NOW | RTLD_LOCAL), look up `warmpool_engine`, call it, and check the vtable: ABI
//   version, every entry point present, name. Between check and dlopen only root or warmpool's own
//   user could swap the file (the directories are checked), and they could write the plugin anyway.
//
// Who loads what
//   Only workers dlopen plugins (ResolveEngine). The supervisor never runs plugin code: it calls
//   CheckEngine, which checks the name and the file and nothing else, so a plugin that crashes in its
//   constructor or in open takes down a worker, which the supervisor restarts, never the supervisor.
//
// Lifetime
//   A loaded plugin stays loaded until the process exits (never dlclosed: engine instances and their
//   vtables point into it). A resolved name is cached per process: replacing <engine>.so takes effect
//   only in workers that have not loaded it yet; restart warmpoold for all of them. A failure is not
//   cached: the next load checks and loads the file again.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "warmpool/engine.h"

namespace warmpool {

// The symbol every plugin exports.
inline constexpr char kPluginEntrySymbol[] = "warmpool_engine";
// Longest engine name.
inline constexpr size_t kMaxEngineNameBytes = 63;

// 1..63 characters of [a-z0-9_-]. INVALID_ARGUMENT otherwise.
Status CheckEngineName(std::string_view name);

// Where an engine comes from, as far as can be told without running any of its code.
struct EngineSource {
  bool builtin = false;
  std::string plugin_path;  // the resolved (symlink-free) path of <engine_dir>/<name>.so; empty if built in
};

// Pure check, no dlopen: the name is built in, or engine_dir is set and <engine_dir>/<name>.so passes
// every file check above. This is all the supervisor may do.
//   INVALID_ARGUMENT     bad name
//   NOT_FOUND            neither built in nor present in engine_dir (or engine_dir is empty)
//   FAILED_PRECONDITION  the file or a directory fails a location, type, owner or permission check
Result<EngineSource> CheckEngine(std::string_view name, const std::string& engine_dir);

// Workers only: the vtable of a built-in engine, else of the plugin <engine_dir>/<name>.so, loaded
// on first use and cached for the life of the process. Thread-safe. Besides CheckEngine's errors:
//   FAILED_PRECONDITION  dlopen failed, no warmpool_engine symbol, it returned null, or the vtable
//                        has another ABI version, another name or an empty entry point
Result<const wp_engine_vtable*> ResolveEngine(std::string_view name, const std::string& engine_dir);

// The vtable checks ResolveEngine applies (Engine::Open checks the first two again at every open):
// abi_version first (the rest of the struct is only read when it matches), then every entry point,
// then that vtable->name equals expected_name when that is not empty.
Status CheckEngineVtable(const wp_engine_vtable* vtable, std::string_view expected_name,
                         std::string_view source);

}  // namespace warmpool
