#include "bench/recovery_log.h"

#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace warmpool::bench {

namespace {

// Milliseconds since the epoch of a line's "YYYY-mm-dd HH:MM:SS.mmm" stamp (local time).
std::optional<int64_t> StampMs(const std::string& line) {
  std::tm tm{};
  int ms = 0;
  if (std::sscanf(line.c_str(), "%d-%d-%d %d:%d:%d.%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  tm.tm_isdst = -1;
  std::time_t t = std::mktime(&tm);
  if (t == static_cast<std::time_t>(-1)) return std::nullopt;
  return static_cast<int64_t>(t) * 1000 + ms;
}

bool Contains(const std::string& line, const std::string& what) {
  return line.find(what) != std::string::npos;
}

}  // namespace

uint64_t LogSize(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return 0;
  return static_cast<uint64_t>(in.tellg());
}

std::string ReadLogFrom(const std::string& path, uint64_t offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(static_cast<std::streamoff>(offset));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

RecoveryLogEvents ParseRecoveryLog(const std::string& text,
                                   std::chrono::system_clock::time_point kill_at, uint32_t slot,
                                   pid_t pid, const std::string& model) {
  RecoveryLogEvents e;
  const int64_t kill_us = std::chrono::duration_cast<std::chrono::microseconds>(
                              kill_at.time_since_epoch()).count();
  const double kill = kill_us / 1000.0;
  const std::string death = fmt::format("worker {} (pid {})", slot, pid);
  const std::string markers = "in-flight markers of worker " + std::to_string(slot);
  const std::string loading = fmt::format("loading \"{}\"", model);
  // With the weights held by the supervisor, the "reload" is an attach of them to another worker.
  const std::string attaching = fmt::format("attaching the resident weights of \"{}\"", model);
  const std::string ready = fmt::format("\"{}\" ready on worker", model);
  const std::string respawned = fmt::format("worker {} ready (pid", slot);
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::optional<int64_t> stamp = StampMs(line);
    if (!stamp.has_value() || *stamp + 1 < kill) continue;
    double at = static_cast<double>(*stamp) - kill;
    if (!e.death_ms && Contains(line, death) && Contains(line, "respawning")) e.death_ms = at;
    if (!e.markers && Contains(line, markers)) {
      size_t p = line.find("reclaimed ");
      if (p != std::string::npos) e.markers = std::stoul(line.substr(p + 10));
    }
    if (!e.reload_start_ms && (Contains(line, loading) || Contains(line, attaching))) {
      e.reload_start_ms = at;
    }
    if (!e.reload_done_ms && Contains(line, ready)) {
      e.reload_done_ms = at;
      size_t close = line.rfind(" ms)");
      size_t open = line.rfind(", ", close);
      if (close != std::string::npos && open != std::string::npos && open < close) {
        e.reload_reported_ms = std::stod(line.substr(open + 2, close - open - 2));
      }
    }
    if (!e.respawn_ms && Contains(line, respawned)) e.respawn_ms = at;
  }
  return e;
}

}  // namespace warmpool::bench
