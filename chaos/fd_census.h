// What a live process holds open, as the harness counts it for "no fd leaked": its descriptors
// besides memory regions, each with what it links to (so that a failed check names them), and how
// many of its memory regions are weights, parked copies and language models' KV caches.
//
// The process runs while it is counted. A call that opens a descriptor and closes it again before
// returning (libsystemd's sd_notify and its datagram socket, uv_spawn's exec-error pipe, a probe's
// output pipe) is visible to a single look at /proc/<pid>/fd. A baseline taken from one look can
// therefore hold one descriptor too many, and every later count then looks like a descriptor
// "closed" since; so a baseline is a settled census: the same over a settle interval.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace warmpool::chaos {

struct FdCensus {
  std::map<int, std::string> others;  // descriptor -> its link; memory regions (memfds) left out
  int weights = 0;                    // memfds holding weights (host, or the cuda double's)
  int parked = 0;                     // memfds holding parked copies
  int kv_caches = 0;                  // memfds holding a replica's KV cache (engine ABI version 10)

  int count() const { return static_cast<int>(others.size()); }
  bool operator==(const FdCensus&) const = default;

  // One look at pid's descriptors; nullopt when the process is gone.
  static std::optional<FdCensus> Take(pid_t pid);
  // Looks until two looks settle_ms apart agree; nullopt when the process is gone or nothing held
  // still for timeout_ms.
  static std::optional<FdCensus> Settled(pid_t pid, int settle_ms = 50, int timeout_ms = 5000);
  // The same over any sequence of looks (Settled(pid) looks with Take(pid)).
  static std::optional<FdCensus> Settled(const std::function<std::optional<FdCensus>()>& look, int settle_ms,
                                         int timeout_ms);

  // "; at the start only: 7 socket:[123]; now only: ..." — empty when both list the same.
  std::string DifferenceFrom(const FdCensus& baseline) const;
};

// "pid name, ..." of pid's children, in the kernel's order.
std::string ChildrenOf(pid_t pid);

}  // namespace warmpool::chaos
