#include "chaos/fd_census.h"

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string_view>
#include <thread>

#include <fmt/format.h>

namespace warmpool::chaos {

std::optional<FdCensus> FdCensus::Take(pid_t pid) {
  std::string base = "/proc/" + std::to_string(pid) + "/fd";
  DIR* dir = opendir(base.c_str());
  if (dir == nullptr) return std::nullopt;
  FdCensus census;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    char target[256];
    ssize_t len = readlink((base + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    std::string_view link(target, len > 0 ? static_cast<size_t>(len) : 0);
    if (link == base) continue;  // the census's own descriptor, when a process counts itself
    if (!link.starts_with("/memfd:")) {
      census.others[std::atoi(e->d_name)] = std::string(link);
      continue;
    }
    // Weights: host regions; on cuda through the driver test double, exported allocations (the
    // double's memfds) and legacy IPC handles. (A real driver's exported descriptors are not
    // memfds: this count is for the host backend and the double.)
    census.weights += link.starts_with("/memfd:warmpool-weights") || link.starts_with("/memfd:fake-cuda") ||
                      link.starts_with("/memfd:warmpool-cuda-ipc");
    census.parked += link.starts_with("/memfd:warmpool-parked");
    census.kv_caches += link.starts_with("/memfd:warmpool-kv-cache");
  }
  closedir(dir);
  return census;
}

std::optional<FdCensus> FdCensus::Settled(pid_t pid, int settle_ms, int timeout_ms) {
  return Settled([pid] { return Take(pid); }, settle_ms, timeout_ms);
}

std::optional<FdCensus> FdCensus::Settled(const std::function<std::optional<FdCensus>()>& look, int settle_ms,
                                          int timeout_ms) {
  std::optional<FdCensus> last = look();
  for (int waited = 0; last && waited < timeout_ms; waited += settle_ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
    std::optional<FdCensus> now = look();
    if (!now || *now == *last) return now;
    last = std::move(now);
  }
  return std::nullopt;
}

std::string FdCensus::DifferenceFrom(const FdCensus& baseline) const {
  std::string out;
  for (const auto& [fd, link] : baseline.others) {
    auto it = others.find(fd);
    if (it == others.end() || it->second != link) out += fmt::format("; at the start only: {} {}", fd, link);
  }
  for (const auto& [fd, link] : others) {
    auto it = baseline.others.find(fd);
    if (it == baseline.others.end() || it->second != link) out += fmt::format("; now only: {} {}", fd, link);
  }
  return out;
}

std::string ChildrenOf(pid_t pid) {
  std::ifstream list(fmt::format("/proc/{}/task/{}/children", pid, pid));
  std::string out;
  for (pid_t child; list >> child;) {
    std::ifstream comm(fmt::format("/proc/{}/comm", child));
    std::string name;
    std::getline(comm, name);
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", child, name);
  }
  return out;
}

}  // namespace warmpool::chaos
