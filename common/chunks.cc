#include "common/chunks.h"

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

namespace warmpool {

bool ForEachChunk(uint64_t bytes, uint64_t chunk, unsigned max_threads,
                  const std::function<bool(uint64_t offset, uint64_t length)>& work) {
  if (bytes == 0) return true;
  const uint64_t chunks = (bytes + chunk - 1) / chunk;
  const auto threads = static_cast<unsigned>(
      std::min<uint64_t>({std::max(1u, max_threads), std::max(1u, std::thread::hardware_concurrency()), chunks}));
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  auto run = [&] {
    for (uint64_t c; !failed.load() && (c = next.fetch_add(1)) < chunks;) {
      const uint64_t offset = c * chunk;
      bool ok = false;
      try {
        ok = work(offset, std::min(chunk, bytes - offset));
      } catch (...) {  // an exception must not leave a helper thread: it would end the process
      }
      if (!ok) failed.store(true);
    }
  };
  std::vector<std::thread> helpers;
  for (unsigned i = 1; i < threads; ++i) {
    try {
      helpers.emplace_back(run);
    } catch (const std::system_error&) {
      break;  // no more threads to be had (a tasks limit): the ones there are do the rest
    }
  }
  run();
  for (std::thread& helper : helpers) helper.join();
  return !failed.load();
}

}  // namespace warmpool
