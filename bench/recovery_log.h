// Where the time of a recovery goes, read from warmpoold's own log (spdlog lines stamped
// "YYYY-mm-dd HH:MM:SS.mmm", local time): when the supervisor handled the worker's death, when the
// model's reload started and finished, and when the killed worker was back. Millisecond resolution,
// relative to the kill; the benchmark's own clocks remain the measurement, this only explains it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace warmpool::bench {

struct RecoveryLogEvents {
  std::optional<double> death_ms;            // "worker S (pid P) ... respawning"
  std::optional<double> reload_start_ms;     // "loading \"model\" (...) on worker W", or
                                             // "attaching the resident weights of \"model\" ..."
  std::optional<double> reload_done_ms;      // "\"model\" ready on worker W (..., N ms)"
  std::optional<double> reload_reported_ms;  // that N
  std::optional<double> respawn_ms;          // "worker S ready (pid ...)"
  std::optional<uint32_t> markers;           // "reclaimed N in-flight markers of worker S"
};

// Size of the file now (0 when unreadable): where the next iteration's lines start.
uint64_t LogSize(const std::string& path);
// The file's bytes from offset to its end.
std::string ReadLogFrom(const std::string& path, uint64_t offset);

// The first matching line of each event at or after the kill (a line stamped within the
// millisecond before it counts: stamps are truncated).
RecoveryLogEvents ParseRecoveryLog(const std::string& text,
                                   std::chrono::system_clock::time_point kill_at, uint32_t slot,
                                   pid_t pid, const std::string& model);

}  // namespace warmpool::bench
