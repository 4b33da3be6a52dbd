// Where a generation's prompt went, by its prefixes: a chat's next turn (or any prompt that begins
// as an earlier one did) goes to the replica whose prefix cache holds that beginning, rather than to
// whichever is least busy, where it would compute its whole history again. The core keys prompts
// without tokenizing them: a chat by its messages (each key covers the tools and every message up
// to it), a text prompt every kPrefixKeyBytes bytes, token ids every kPrefixKeyTokens (a KV block).
// A key says only that the replica was sent a prompt beginning so; whether its cache still holds
// the blocks is the engine's to find. A preference only: the replica must have a free sequence and
// KV room (policy::PickReplicaPreferring), and homes go with the replica's cache (Core::ForgetKvCaches).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "ipc/warmpool.pb.h"

namespace warmpool::supervisor {

inline constexpr uint64_t kPrefixKeyBytes = 1024;
inline constexpr uint32_t kPrefixKeyTokens = 64;
inline constexpr size_t kMostPrefixKeys = 256;  // of one prompt: its first 256 KiB of text, say
inline constexpr uint64_t kMostPrefixBytes = 256 << 10;  // hashed of one prompt: a chat's messages stop there

// The keys of a generation's prompt, shortest prefix first (none for an empty prompt).
std::vector<uint64_t> PrefixKeys(const v1::GenerateRequest& request);

class PrefixHomes {
 public:
  static constexpr uint32_t kNoHome = UINT32_MAX;  // policy::kNone
  static constexpr size_t kMostHomes = 16384;

  // The prompt with these keys went to `worker`, replica of `model`.
  void Remember(uint32_t model, std::span<const uint64_t> keys, uint32_t worker);
  // The worker the longest of `keys` went to last; kNoHome: none.
  uint32_t Find(uint32_t model, std::span<const uint64_t> keys) const;
  // Forgets every home where keep(model, worker) is false. It asks once per replica that has
  // homes and goes through the homes only when one goes: the core calls it after every event.
  template <typename Keep>
  void ForgetUnless(Keep keep) {
    bool any = false;
    for (const auto& [owner, count] : owners_) any = any || !keep(owner.first, owner.second);
    if (!any) return;
    for (auto it = homes_.begin(); it != homes_.end();) {
      it = keep(it->first.first, it->second.worker) ? std::next(it) : Erase(it);
    }
  }
  size_t size() const { return homes_.size(); }

 private:
  struct Home {
    uint32_t worker = 0;
    uint64_t stamp = 0;  // when it was remembered: past kMostHomes, the oldest go
  };
  using Homes = std::map<std::pair<uint32_t, uint64_t>, Home>;  // by model and key
  Homes::iterator Erase(Homes::iterator it);
  Homes homes_;
  std::map<std::pair<uint32_t, uint32_t>, size_t> owners_;  // homes by model and worker
  uint64_t stamp_ = 0;
};

}  // namespace warmpool::supervisor
