// Per-record seqlock: the single writer (the supervisor) makes the record's seq odd, writes, and makes
// it even again; a reader copies the record and retries while seq was odd or changed meanwhile.
// Readers never block the writer, and a writer that dies mid-write only makes readers give up.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>

namespace warmpool::shm {

template <typename Record, typename Fn>
void SeqWrite(Record& record, Fn&& fn) {
  std::atomic_ref<uint32_t> seq(record.seq);
  uint32_t start = seq.load(std::memory_order_relaxed);
  seq.store(start + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  fn(record);
  seq.store(start + 2, std::memory_order_release);
}

// A consistent copy, or nullopt when the writer kept the record busy for max_tries attempts (a
// supervisor killed mid-write leaves seq odd forever).
template <typename Record>
std::optional<Record> SeqRead(const Record& record, int max_tries = 1 << 20) {
  std::atomic_ref<uint32_t> seq(const_cast<uint32_t&>(record.seq));
  for (int i = 0; i < max_tries; i++) {
    uint32_t before = seq.load(std::memory_order_acquire);
    if (before & 1u) continue;
    Record copy;
    std::memcpy(static_cast<void*>(&copy), &record, sizeof(Record));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq.load(std::memory_order_relaxed) == before) return copy;
  }
  return std::nullopt;
}

}  // namespace warmpool::shm
