#include "supervisor/core/prefix_homes.h"

#include <algorithm>
#include <string_view>

namespace warmpool::supervisor {
namespace {

// FNV-1a, 64 bits, carried on from `hash`: the same bytes give the same key in every run (the
// keys are compared only within one core, but the simulator replays them).
uint64_t Mix(uint64_t hash, std::string_view bytes) {
  for (const char c : bytes) hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return hash;
}

// A field of a message, its length first, so that no two sequences of fields run together alike.
uint64_t MixField(uint64_t hash, std::string_view field) {
  const uint64_t size = field.size();
  return Mix(Mix(hash, std::string_view(reinterpret_cast<const char*>(&size), sizeof(size))), field);
}

constexpr uint64_t kOffsetBasis = 0xcbf29ce484222325ull;

}  // namespace

std::vector<uint64_t> PrefixKeys(const v1::GenerateRequest& request) {
  std::vector<uint64_t> keys;
  if (request.messages_size() > 0) {
    uint64_t hash = Mix(kOffsetBasis, "messages");
    uint64_t bytes = 0;
    for (const std::string& tool : request.tools()) {
      if (bytes > kMostPrefixBytes) return keys;  // (tools alone past it: no key)
      hash = MixField(hash, tool);
      bytes += tool.size();
    }
    for (const v1::ChatMessage& message : request.messages()) {
      // The core's own thread hashes them: a prompt of a long context is not hashed whole.
      if (keys.size() == kMostPrefixKeys || bytes > kMostPrefixBytes) break;
      bytes += message.role().size() + message.content().size() + message.tool_call_id().size() + message.name().size();
      for (const v1::ToolCall& call : message.tool_calls()) {
        bytes += call.id().size() + call.name().size() + call.arguments().size();
      }
      hash = MixField(MixField(hash, message.role()), message.content());
      for (const v1::ToolCall& call : message.tool_calls()) {
        hash = MixField(MixField(MixField(hash, call.id()), call.name()), call.arguments());
      }
      hash = MixField(MixField(hash, message.tool_call_id()), message.name());
      keys.push_back(hash);
    }
    return keys;
  }
  if (request.tokens_size() > 0) {
    uint64_t hash = Mix(kOffsetBasis, "tokens");
    const auto* tokens = reinterpret_cast<const char*>(request.tokens().data());
    for (int from = 0; from + static_cast<int>(kPrefixKeyTokens) <= request.tokens_size() &&
                       keys.size() < kMostPrefixKeys;
         from += kPrefixKeyTokens) {
      hash = Mix(hash, std::string_view(tokens + from * sizeof(int32_t), kPrefixKeyTokens * sizeof(int32_t)));
      keys.push_back(hash);
    }
    return keys;
  }
  const std::string_view prompt = request.prompt();
  uint64_t hash = Mix(kOffsetBasis, "prompt");
  for (uint64_t from = 0; from + kPrefixKeyBytes <= prompt.size() && keys.size() < kMostPrefixKeys;
       from += kPrefixKeyBytes) {
    hash = Mix(hash, prompt.substr(from, kPrefixKeyBytes));
    keys.push_back(hash);
  }
  return keys;
}

PrefixHomes::Homes::iterator PrefixHomes::Erase(Homes::iterator it) {
  auto owner = owners_.find({it->first.first, it->second.worker});
  if (--owner->second == 0) owners_.erase(owner);
  return homes_.erase(it);
}

void PrefixHomes::Remember(uint32_t model, std::span<const uint64_t> keys, uint32_t worker) {
  ++stamp_;
  for (const uint64_t key : keys) {
    const auto [it, added] = homes_.try_emplace({model, key}, Home{worker, stamp_});
    if (!added) {
      if (it->second.worker == worker) {
        it->second.stamp = stamp_;
        continue;
      }
      auto before = owners_.find({model, it->second.worker});  // it moves from there
      if (--before->second == 0) owners_.erase(before);
      it->second = {worker, stamp_};
    }
    owners_[{model, worker}]++;
  }
  if (homes_.size() <= kMostHomes) return;
  // The oldest quarter goes, so that this sort runs once in many Remembers.
  std::vector<uint64_t> stamps;
  stamps.reserve(homes_.size());
  for (const auto& [key, home] : homes_) stamps.push_back(home.stamp);
  const auto cut = stamps.begin() + static_cast<ptrdiff_t>(homes_.size() - kMostHomes * 3 / 4);
  std::nth_element(stamps.begin(), cut, stamps.end());
  const uint64_t oldest_kept = *cut;
  for (auto it = homes_.begin(); it != homes_.end();) {
    it = it->second.stamp < oldest_kept ? Erase(it) : std::next(it);
  }
}

uint32_t PrefixHomes::Find(uint32_t model, std::span<const uint64_t> keys) const {
  for (auto key = keys.rbegin(); key != keys.rend(); ++key) {
    if (auto it = homes_.find({model, *key}); it != homes_.end()) return it->second.worker;
  }
  return kNoHome;
}

}  // namespace warmpool::supervisor
