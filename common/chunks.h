// Work over a large range split into chunks and spread over a few threads: what copying weights
// needs, since one core moves far less than the memory can (on the development VM a 1 GiB copy
// takes ~250 ms on one thread and ~110 ms on two).
#pragma once

#include <cstdint>
#include <functional>

namespace warmpool {

// Calls work(offset, length) for the consecutive chunks of `chunk` bytes covering [0, bytes), in
// order of offset, from up to `max_threads` threads (the calling one included; no more than the
// CPUs or the chunks; fewer when no more threads can be started). After a call returns false (or
// throws) no further chunk starts; returns whether every call returned true.
bool ForEachChunk(uint64_t bytes, uint64_t chunk, unsigned max_threads,
                  const std::function<bool(uint64_t offset, uint64_t length)>& work);

}  // namespace warmpool
