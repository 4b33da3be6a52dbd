// After a burst of large requests the heap keeps its high-water mark: glibc returns memory to the
// kernel only from the top of the heap. Once nothing is open, and at most once a second, the daemon
// gives back what is free (malloc_trim), so that an idle daemon's resident size falls back.
#pragma once

#include <malloc.h>

#include <cstdint>

namespace warmpool::supervisor {

class HeapTrim {
 public:
  // Called on every tick: `unanswered` requests are open now, `now_ms` a monotonic clock.
  void OnTick(uint64_t unanswered, uint64_t now_ms) {
    if (unanswered != 0) {
      busy_since_trim_ = true;
      return;
    }
    if (!busy_since_trim_ || now_ms - last_trim_ms_ < 1000) return;
    busy_since_trim_ = false;
    last_trim_ms_ = now_ms;
    malloc_trim(0);
  }

 private:
  bool busy_since_trim_ = false;
  uint64_t last_trim_ms_ = 0;
};

}  // namespace warmpool::supervisor
