#include "common/chunks.h"

#include <algorithm>
#include <atomic>
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
      if (!work(offset, std::min(chunk, bytes - offset))) failed.store(true);
    }
  };
  std::vector<std::thread> helpers;
  for (unsigned i = 1; i < threads; ++i) helpers.emplace_back(run);
  run();
  for (std::thread& helper : helpers) helper.join();
  return !failed.load();
}

}  // namespace warmpool
