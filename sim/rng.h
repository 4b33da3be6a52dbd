// The simulator's only source of randomness: SplitMix64, so that a seed replays the same run on
// every machine (std::uniform_int_distribution is not specified bit for bit).
#pragma once

#include <cstdint>

namespace warmpool::sim {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // 0 <= x < n (n > 0).
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }
  // lo <= x <= hi.
  uint64_t Range(uint64_t lo, uint64_t hi) { return lo + Below(hi - lo + 1); }
  // True with probability per_mille / 1000.
  bool Chance(uint32_t per_mille) { return Below(1000) < per_mille; }

 private:
  uint64_t state_;
};

}  // namespace warmpool::sim
