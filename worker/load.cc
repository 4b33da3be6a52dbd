// A model's load, on the load thread. The model file comes open from the supervisor, which opened
// it beneath its model root (supervisor/model_roots.h): this process never resolves a path, so a
// directory swapped for a symlink since registration cannot lead it out of the roots. Engines,
// which take a path (engine.h), get /proc/self/fd/N: a name for this very open file that no
// rename or symlink can redirect.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "engines/catalog/plugin_loader.h"
#include "engines/safetensors.h"
#include "engines/tensors/tensor_proto.h"
#include "ipc/error_proto.h"
#include "ipc/file_version_proto.h"
#include "worker/generation_stream.h"
#include "worker/load_thread.h"

namespace warmpool::worker {

void DescribeEngine(const Engine& engine, v1::ModelWeights* weights) {
  const wp_engine_info& info = engine.info();
  weights->set_weight_bytes(info.weight_bytes);
  weights->set_workspace_bytes(info.workspace_bytes);
  weights->set_in_features(info.in_features);
  weights->set_out_features(info.out_features);
  weights->set_context(info.context);
  // Generations at once: what a stepping engine says, one for an engine that runs them alone.
  weights->set_sequences(!engine.generates() ? 0 : engine.steps() ? std::max(info.sequences, 1u) : 1);
  weights->set_kv_bytes_per_token(info.kv_bytes_per_token);
  weights->set_kv_tokens(info.kv_tokens);
  weights->set_embedding_size(info.embedding_size);
  weights->set_embeds_only(engine.embeds_only());
  weights->clear_inputs();
  weights->clear_outputs();
  weights->set_runs_tensors(engine.runs_tensors());
  Result<Engine::TensorSignature> signature = engine.runs_tensors() ? engine.Signature() : Result<Engine::TensorSignature>(Engine::TensorSignature{});
  if (!signature.ok()) return;  // an engine's broken statement: its runs will say so
  for (const wp_tensor& t : signature->inputs) tensors::CopyInto(t, weights->add_inputs());
  for (const wp_tensor& t : signature->outputs) tensors::CopyInto(t, weights->add_outputs());
}

namespace {

bool IsDirectory(int fd) {
  struct stat st{};
  return fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
}

// A directory's version is over the files in it (common/file_version.h DirectoryVersion).
Result<FileVersion> VersionOf(int fd, const std::string& path) {
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    return Error(Code::kInternal, "model file \"{}\": cannot look at it: {}", path, std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) return FileVersionOf(st);
  FileVersion version = DirectoryVersion(fd);
  if (!version.known()) return Error(Code::kInternal, "model directory \"{}\": cannot list it", path);
  return version;
}

// Written in place while it was read (same inode: a rename leaves the open file as it was). A
// directory's identity mixes its files' in: any of them replaced is a change too.
bool ChangedInPlace(const FileVersion& before, const FileVersion& after, bool directory) {
  if (directory) return before != after;
  return before.size != after.size || before.mtime_ns != after.mtime_ns || before.ctime_ns != after.ctime_ns;
}

// Engines name their file in messages: the path the model is registered at, not /proc/self/fd/N.
Status Named(const Status& status, const std::string& fd_path, const std::string& path) {
  if (status.ok() || fd_path.empty()) return status;
  std::string message = status.message();
  for (size_t at = message.find(fd_path); at != std::string::npos; at = message.find(fd_path, at + path.size())) {
    message.replace(at, fd_path.size(), path);
  }
  return Status(status.code(), message);
}

}  // namespace

void ShareCache(Engine& engine, const MemoryService& memory, v1::WorkerLoadDone& done, std::vector<int>& shared) {
  if (std::optional<Engine::KvCacheUsage> usage = engine.KvUsage()) WriteKvUsage(*usage, done.mutable_kv_usage());
  // Its KV cache goes to the supervisor too, after the weights: when this process dies, a stream
  // resumed elsewhere copies its keys and values from there (engine ABI version 10).
  Result<wp_region> cache = engine.ExportCache();
  if (!cache.ok()) return;
  shared.push_back(cache->handle);
  done.set_cache_shared(true);
  done.set_cache_bytes(cache->bytes);
  done.set_cache_grant(memory.GrantOf(*cache));  // a GPU's pool: device memory from the budget
}

void LoadThread::RunLoad(const v1::WorkerLoad& request, int file) {
  std::optional<JobMark> mark(std::in_place, marks_, request.job(), request.model());
  v1::WorkerEnvelope reply;
  v1::WorkerLoadDone* done = reply.mutable_load_done();
  done->set_job(request.job());
  JobFaults faults = outbox_.FaultsFor(request.job(), request.faults());
  memory_.SetAllocFaults(&faults);
  faults.Hit("load.begin");
  std::vector<int> shared;
  Status status = Load(request, file, faults, *done, shared);
  if (file >= 0) close(file);
  memory_.SetAllocFaults(nullptr);
  if (!status.ok()) ipc::SetError(done->mutable_error(), status);
  mark.reset();
  JobDone(request.model());
  // The fds stay open here (the engine owns them); the kernel gives the supervisor its own copies.
  outbox_.Send(reply, shared);
}

Status LoadThread::Load(const v1::WorkerLoad& request, int file, JobFaults& faults, v1::WorkerLoadDone& done,
                        std::vector<int>& shared) {
  Result<const wp_engine_vtable*> vtable = ResolveEngine(request.engine(), options_.engine_dir);
  if (!vtable.ok()) return vtable.status();
  const std::string& path = request.path();
  // The header is read here, once, and the engine is opened from these very bytes: what the
  // supervisor records with the weights is exactly what they were loaded by, whatever the file
  // on disk says later.
  std::vector<uint8_t> header;
  uint64_t file_size = 0;
  std::string fd_path;
  FileVersion version;
  // A model directory: the engine reads it beneath the descriptor and says what it read (its
  // description, the header an attach is opened by).
  const bool directory = file >= 0 && IsDirectory(file);
  if (!path.empty()) {
    if (file < 0) return Error(Code::kInternal, "the load of \"{}\" came without its file", request.name());
    Result<FileVersion> before = VersionOf(file, path);
    if (!before.ok()) return before.status();
    version = *before;
    if (directory) {
      file_size = version.size;
    } else {
      Result<safetensors::Header> read = safetensors::ReadHeaderFrom(file, path, &header);
      if (!read.ok()) return read.status();
      file_size = read->file_size;
      done.mutable_weights()->set_header(header.data(), header.size());
    }
    done.mutable_weights()->set_file_size(file_size);
    ipc::SetFileVersion(done.mutable_weights()->mutable_file_version(), version);
    fd_path = fmt::format("/proc/self/fd/{}", file);
  }
  wp_engine_spec spec = SpecForFile(request.name().c_str(), directory ? path.c_str() : fd_path.c_str(),
                      header.empty() ? nullptr : header.data(), header.size(), file_size);
  spec.has_directory = directory ? 1 : 0;
  spec.directory_fd = directory ? file : -1;
  spec.sequences = request.sequences();
  spec.kv_tokens = request.kv_tokens();
  spec.prefill_stretch = request.prefill_stretch();
  Result<Engine> engine = Engine::Open(*vtable, spec, memory_.engines());
  if (!engine.ok()) return Named(engine.status(), fd_path, path);
  if (directory) {
    Result<std::string> described = engine->Describe();
    if (!described.ok()) return described.status();
    done.mutable_weights()->set_header(*described);
  }
  const wp_engine_info& info = engine->info();
  DescribeEngine(*engine, done.mutable_weights());
  done.mutable_weights()->set_prefill_stretch(request.prefill_stretch());  // what an attach opens with
  if (request.admitted_bytes() != 0 &&
      info.weight_bytes + info.workspace_bytes > request.admitted_bytes()) {
    // The file changed since it was registered (or its engine's workspace was unknown): room was
    // made for less than it needs. Nothing is allocated; the supervisor admits it again.
    done.set_file_changed(true);
    return OkStatus();
  }
  auto last_report = std::chrono::steady_clock::now();
  bool first_progress = true;
  Status status = engine->Load([&](uint64_t done_bytes, uint64_t total_bytes) {
    if (first_progress) {
      first_progress = false;
      faults.Hit("load.mid_copy");
    }
    if (Stopping()) return false;  // the worker is shutting down: the load gives up
    auto now = std::chrono::steady_clock::now();
    if (now - last_report > std::chrono::milliseconds(100)) {
      last_report = now;
      v1::WorkerEnvelope progress;
      progress.mutable_load_progress()->set_job(request.job());
      progress.mutable_load_progress()->set_done_bytes(done_bytes);
      progress.mutable_load_progress()->set_total_bytes(total_bytes);
      outbox_.Send(progress);
    }
    return true;
  });
  if (!status.ok()) return Named(status, fd_path, path);
  if (!path.empty()) {
    // Rewritten while it was read (the same size, so the engine did not notice)? Then these
    // weights are of neither version: the supervisor loads the file again as it is now.
    Result<FileVersion> after = VersionOf(file, path);
    if (!after.ok()) return after.status();
    if (ChangedInPlace(version, *after, directory)) {
      std::vector<uint8_t> now;
      Result<safetensors::Header> again =
          directory ? Result<safetensors::Header>(Error(Code::kFailedPrecondition, "a directory"))
                    : safetensors::ReadHeaderFrom(file, path, &now);
      if (again.ok()) {
        done.mutable_weights()->set_header(now.data(), now.size());
        done.mutable_weights()->set_file_size(again->file_size);
      }
      ipc::SetFileVersion(done.mutable_weights()->mutable_file_version(), *after);
      done.set_file_changed(true);
      return OkStatus();
    }
  }
  faults.Hit("load.before_ready");
  // The weights' handle goes to the supervisor, which keeps them alive past this process.
  Result<wp_region> weights = engine->ExportWeights();
  if (weights.ok() && weights->handle >= 0) {
    shared.push_back(weights->handle);
    done.set_weights_shared(true);
    done.set_grant(memory_.GrantOf(*weights));
    memory_.KeepMappingOf(weights->handle);
  }
  ShareCache(*engine, memory_, done, shared);
  models_.Put(request.model(), std::move(*engine));
  return OkStatus();
}

}  // namespace warmpool::worker
