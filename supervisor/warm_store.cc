#include "supervisor/warm_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ipc/warmpool.pb.h"
#include "ipc/warm_store.pb.h"

namespace warmpool::supervisor {

namespace {

constexpr char kPrefix[] = "wp.";
constexpr char kManifestPrefix[] = "wp.manifest.";
constexpr uint64_t kMaxManifestBytes = 64ull << 20;

bool Ours(const std::string& name) { return name.rfind(kPrefix, 0) == 0; }

uint64_t VersionHash(const FileVersion& v) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
  for (uint64_t x : {v.size, v.mtime_ns, v.inode, v.device, v.ctime_ns}) {
    for (int i = 0; i < 8; i++) {
      h ^= (x >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

// A memfd (F_GET_SEALS answers only for those) that is a regular file of at least `bytes`; with
// memfd_required false, any open descriptor that is not one passes (cuda's exported memory).
Status CheckRegion(int fd, uint64_t bytes, bool memfd_required) {
  struct stat st {};
  const bool memfd = fcntl(fd, F_GET_SEALS) >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (!memfd) {
    if (!memfd_required && fcntl(fd, F_GETFD) >= 0) return OkStatus();
    return Error(Code::kInvalidArgument, "it is not a memory region");
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return Error(Code::kInvalidArgument, "it holds {} bytes, not the {} described", st.st_size, bytes);
  }
  return OkStatus();
}

Result<v1::KeptManifest> ReadManifest(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kMaxManifestBytes) {
    return Error(Code::kInvalidArgument, "not a manifest of at most {} bytes", kMaxManifestBytes);
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error(Code::kInvalidArgument, "short read");
    done += static_cast<size_t>(n);
  }
  v1::KeptManifest manifest;
  if (!manifest.ParseFromString(bytes)) return Error(Code::kInvalidArgument, "it does not parse");
  return manifest;
}

KeptWeights FromRecord(const v1::KeptModel& m, int fd) {
  KeptWeights k;
  k.name = m.name();
  k.engine = m.engine();
  k.path = m.path();
  k.parked = m.parked();
  k.weights = Weights{FromWire(m.weights())};
  k.weights.device = m.device();
  k.weights.handle = fd;
  k.kv_cache = m.kv_cache();
  return k;
}

}  // namespace

v1::KeptModel DescribeKept(const KeptWeights& k, const std::string& fd_name, uint64_t fingerprint) {
  v1::KeptModel m;
  m.set_name(k.name);
  m.set_engine(k.engine);
  m.set_path(k.path);
  m.set_parked(k.parked);
  m.set_device(k.weights.device);
  ToWire(k.weights, m.mutable_weights());
  m.set_fd_name(fd_name);
  m.set_fingerprint(fingerprint);
  m.set_kv_cache(k.kv_cache);
  return m;
}

uint64_t RegionFingerprint(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 8) return 0;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  constexpr uint64_t kSamples = 256;
  uint64_t h = 1469598103934665603ull ^ size;
  for (uint64_t i = 0; i <= kSamples + 1; i++) {
    // The first word, 256 spread between, the last: a load into reused memory rewrites most of it.
    const uint64_t at = i == kSamples + 1 ? size - 8 : (size - 8) * i / (kSamples + 1);
    uint64_t word = 0;
    if (pread(fd, &word, sizeof(word), static_cast<off_t>(at)) != static_cast<ssize_t>(sizeof(word))) return 0;
    h = (h ^ word) * 1099511628211ull;
    h ^= h >> 29;
  }
  return h == 0 ? 1 : h;
}

bool Keepable(const KeptWeights& kept) {
  return kept.weights.handle >= 0 && kept.weights.header.size() <= WarmStore::kMaxKeptHeaderBytes;
}

Result<int> WriteManifest(const v1::KeptManifest& manifest) {
  const std::string content = manifest.SerializeAsString();
  const int fd = memfd_create("warmpool-manifest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Error(Code::kInternal, "memfd_create: {}", std::strerror(errno));
  for (size_t done = 0; done < content.size();) {
    ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return Error(Code::kInternal, "writing the manifest: {}", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  // Sealed: whoever gets it next reads exactly what was written.
  fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  return fd;
}

std::string KeptName(const KeptWeights& kept, const std::string& unique) {
  const char kind = kept.kv_cache ? 'k' : kept.parked ? 'p' : 'w';
  return fmt::format("wp.{}.{}.{:016x}.{}", kind, kept.name, VersionHash(kept.weights.version), unique);
}

Result<std::vector<PassedDescriptor>> PassedDescriptors() {
  char** names = nullptr;
  // unset_environment=1: LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES describe this process only (and
  // never reach the workers). sd_listen_fds sets FD_CLOEXEC on every descriptor it returns.
  const int n = sd_listen_fds_with_names(1, &names);
  if (n < 0) return Error(Code::kFailedPrecondition, "LISTEN_FDS: {}", std::strerror(-n));
  std::vector<PassedDescriptor> passed;
  for (int i = 0; i < n; i++) {
    passed.push_back({SD_LISTEN_FDS_START + i, names != nullptr && names[i] != nullptr ? names[i] : "unknown"});
  }
  if (names != nullptr) {
    for (int i = 0; i < n; i++) std::free(names[i]);
    std::free(names);
  }
  return passed;
}

Result<int> ActivatedSocket(std::vector<PassedDescriptor>& passed) {
  std::vector<PassedDescriptor> rest;
  std::vector<int> sockets;
  for (const PassedDescriptor& d : passed) {
    if (Ours(d.name)) {
      rest.push_back(d);
    } else if (sd_is_socket(d.fd, AF_UNIX, SOCK_STREAM, 1) > 0) {
      sockets.push_back(d.fd);
    } else {
      spdlog::warn("closing descriptor {} (\"{}\") passed by the service manager: not a listening "
                   "Unix stream socket",
                   d.fd, d.name);
      close(d.fd);
    }
  }
  passed = std::move(rest);
  if (sockets.size() > 1) {
    return Error(Code::kFailedPrecondition,
                 "the service manager passed {} sockets; warmpool.socket must have exactly one "
                 "ListenStream=",
                 sockets.size());
  }
  return sockets.empty() ? -1 : sockets.front();
}

WarmStore::WarmStore(std::string instance, bool enabled) : instance_(std::move(instance)), enabled_(enabled) {
  manifest_.set_instance(instance_);  // nothing kept: no manifest needed
}

WarmStore::~WarmStore() = default;

std::vector<KeptWeights> WarmStore::Receive(std::vector<PassedDescriptor>& passed, bool device_memfds) {
  std::map<std::string, int> handles;
  std::vector<std::pair<uint64_t, PassedDescriptor>> manifests;  // (sequence, descriptor)
  std::vector<PassedDescriptor> rest;
  for (PassedDescriptor& d : passed) {
    if (!Ours(d.name)) {
      rest.push_back(d);
      continue;
    }
    received_.insert(d.name);
    if (d.name.rfind(kManifestPrefix, 0) == 0) {
      const uint64_t sequence = std::strtoull(d.name.c_str() + std::strlen(kManifestPrefix), nullptr, 10);
      // Every manifest's number, readable or not: a new one must never take the name of one still
      // in the store (its removal below would remove the new one too).
      sequence_ = std::max(sequence_, sequence);
      manifests.emplace_back(sequence, d);
    } else if (!handles.emplace(d.name, d.fd).second) {
      close(d.fd);  // the same name twice: the first one is the one a manifest means
    }
  }
  passed = std::move(rest);
  std::sort(manifests.begin(), manifests.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::optional<v1::KeptManifest> manifest;
  for (auto& [sequence, d] : manifests) {
    if (!manifest) {
      Result<v1::KeptManifest> read = ReadManifest(d.fd);
      if (!read.ok()) {
        spdlog::warn("ignoring kept manifest \"{}\": {}", d.name, read.status().message());
      } else if (read->instance() != instance_) {
        spdlog::warn("ignoring kept manifest \"{}\": it is instance \"{}\"'s, not \"{}\"'s", d.name,
                     read->instance(), instance_);
      } else {
        manifest = std::move(*read);
        manifest_name_ = d.name;
        received_.erase(d.name);
      }
    }
    close(d.fd);
  }
  std::vector<KeptWeights> kept;
  if (manifest) {
    for (const v1::KeptModel& m : manifest->models()) {
      auto it = handles.find(m.fd_name());
      if (it == handles.end()) {
        spdlog::warn("the weights kept of \"{}\" are missing from the store: it loads from its file", m.name());
        continue;
      }
      const int fd = it->second;
      handles.erase(it);
      // A record with no description is an older warmpoold's (it wrote the fields one by one).
      Status s = m.has_weights() ? CheckRegion(fd, m.weights().weight_bytes(), m.parked() || device_memfds)
                                 : Error(Code::kFailedPrecondition, "it was kept by an older warmpoold, whose "
                                                                    "record of the weights this one does not read");
      const uint64_t fingerprint = s.ok() ? RegionFingerprint(fd) : 0;
      if (s.ok() && fingerprint != m.fingerprint()) {
        s = Error(Code::kFailedPrecondition, "its bytes are not the ones stored (the memory was reused)");
      }
      if (!s.ok()) {
        spdlog::warn("closing the weights kept of \"{}\" (\"{}\"): {}", m.name(), m.fd_name(), s.message());
        close(fd);
        continue;
      }
      stored_[fd] = Stored{m.fd_name(), fingerprint};
      received_.erase(m.fd_name());
      *manifest_.add_models() = m;
      kept.push_back(FromRecord(m, fd));
    }
  }
  for (auto& [name, fd] : handles) {
    spdlog::warn("closing kept descriptor \"{}\": no manifest names it", name);
    close(fd);
  }
  if (!kept.empty() || !received_.empty()) {
    spdlog::info("received {} kept weights{}", kept.size(),
                 received_.empty() ? "" : fmt::format(" ({} other descriptors let go)", received_.size()));
  }
  return kept;
}

bool WarmStore::Store(int fd, const std::string& name) {
  const std::string state = "FDSTORE=1\nFDNAME=" + name;
  const int rc = sd_pid_notify_with_fds(0, 0, state.c_str(), &fd, 1);
  if (rc > 0) return true;
  if (!refused_logged_) {
    refused_logged_ = true;
    spdlog::warn("the service manager did not take descriptor \"{}\" ({}): models will load again "
                 "after a restart",
                 name, rc < 0 ? std::strerror(-rc) : "NOTIFY_SOCKET is not set");
  }
  return false;
}

void WarmStore::Remove(const std::string& name) {
  const std::string state = "FDSTOREREMOVE=1\nFDNAME=" + name;
  sd_notify(0, state.c_str());
}

void WarmStore::WriteNewManifest(v1::KeptManifest manifest) {
  const uint64_t sequence = ++sequence_;
  manifest.set_sequence(sequence);
  const std::string name = fmt::format("{}{}", kManifestPrefix, sequence);
  Result<int> fd = WriteManifest(manifest);
  if (!fd.ok()) {
    spdlog::warn("cannot write the manifest of the kept weights: {}", fd.status().message());
    return;
  }
  if (Store(*fd, name)) {
    if (!manifest_name_.empty()) Remove(manifest_name_);
    manifest_name_ = name;
    manifest.clear_sequence();
    manifest_ = std::move(manifest);
  }
  close(*fd);
}

void WarmStore::Sync(const std::vector<KeptWeights>& kept) {
  if (!enabled_) return;
  // What the start left behind goes first: it takes room in the store that new handles need.
  for (const std::string& name : received_) Remove(name);
  received_.clear();
  v1::KeptManifest manifest;
  manifest.set_instance(instance_);
  std::set<int> wanted;
  for (const KeptWeights& k : kept) {
    if (!Keepable(k)) continue;
    auto it = stored_.find(k.weights.handle);
    if (it == stored_.end()) {
      // Unique across daemons: the store may still hold names a daemon before this one gave.
      const std::string name = KeptName(k, fmt::format("{:x}-{:x}", getpid(), ++next_name_));
      if (!Store(k.weights.handle, name)) continue;
      it = stored_.emplace(k.weights.handle, Stored{name, RegionFingerprint(k.weights.handle)}).first;
    }
    wanted.insert(k.weights.handle);
    *manifest.add_models() = DescribeKept(k, it->second.name, it->second.fingerprint);
  }
  if (manifest.SerializeAsString() != manifest_.SerializeAsString()) {
    WriteNewManifest(std::move(manifest));
  }
  for (auto it = stored_.begin(); it != stored_.end();) {
    if (wanted.count(it->first) != 0) {
      ++it;
      continue;
    }
    Remove(it->second.name);
    it = stored_.erase(it);
  }
}

void WarmStore::Forget(int fd) {
  if (!enabled_) return;
  auto it = stored_.find(fd);
  if (it == stored_.end()) return;
  const std::string name = it->second.name;
  stored_.erase(it);
  Remove(name);
  // And a manifest that no longer names it, before its memory can hold anything else.
  v1::KeptManifest manifest;
  manifest.set_instance(instance_);
  for (const v1::KeptModel& m : manifest_.models()) {
    if (m.fd_name() != name) *manifest.add_models() = m;
  }
  if (manifest.models_size() != manifest_.models_size()) WriteNewManifest(std::move(manifest));
}

}  // namespace warmpool::supervisor
