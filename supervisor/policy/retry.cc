#include "supervisor/policy/retry.h"

#include <algorithm>

namespace warmpool::supervisor::policy {

bool RetryAfterCrash(uint32_t crashes_alone, uint32_t crashes_shared) {
  if (crashes_alone == 0) return crashes_shared < kMaxCrashesOfRequest;
  return crashes_alone + crashes_shared < 2;
}

bool ChargeCrash(CrashRecord& record, uint64_t now_ms, const RetrySettings& settings, bool alone) {
  record.times_ms.push_back(now_ms);
  if (alone) record.alone_times_ms.push_back(now_ms);
  for (std::deque<uint64_t>* times : {&record.times_ms, &record.alone_times_ms}) {
    while (!times->empty() && now_ms - times->front() > settings.crash_loop_window_ms) times->pop_front();
  }
  if (record.alone_times_ms.size() < settings.crash_loop_crashes &&
      record.times_ms.size() < uint64_t{kSharedCrashLoopFactor} * settings.crash_loop_crashes) {
    return false;
  }
  record.times_ms.clear();
  record.alone_times_ms.clear();
  return true;
}

uint64_t NextCooldown(CrashRecord& record, const RetrySettings& settings) {
  record.cooldown_ms = record.cooldown_ms == 0
                           ? settings.cooldown_ms
                           : std::min(record.cooldown_ms * 2, settings.cooldown_max_ms);
  return record.cooldown_ms;
}

void Forgive(CrashRecord& record, uint64_t now_ms, const RetrySettings& settings) {
  if (!record.times_ms.empty() && now_ms - record.times_ms.back() > settings.crash_loop_window_ms) {
    record.times_ms.clear();
    record.alone_times_ms.clear();
    record.cooldown_ms = 0;
  }
}

uint64_t RespawnDelay(uint64_t last_delay_ms, uint64_t lived_ms, const RetrySettings& settings) {
  bool stable = lived_ms >= settings.respawn_stable_ms;
  if (stable || last_delay_ms == 0) return settings.respawn_min_ms;
  return std::min(last_delay_ms * 2, settings.respawn_max_ms);
}

}  // namespace warmpool::supervisor::policy
