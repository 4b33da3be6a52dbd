#include "supervisor/grants.h"

namespace warmpool::supervisor {

uint64_t GrantTable::Ask(uint32_t device, uint32_t slot, uint32_t generation, uint64_t request, uint64_t bytes) {
  const uint64_t id = next_++;
  Grant grant;
  grant.asker = Asker{device, slot, generation, request};
  grant.bytes = bytes;
  grants_[id] = grant;
  return id;
}

uint64_t GrantTable::Unkept(uint32_t slot, uint32_t generation) const {
  uint64_t bytes = 0;
  for (const auto& [id, grant] : grants_) {
    if (grant.kept_fd < 0 && !grant.abandoned && grant.asker.slot == slot && grant.asker.generation == generation) {
      bytes += grant.bytes;
    }
  }
  return bytes;
}

std::optional<GrantTable::Asker> GrantTable::Answered(uint64_t grant, bool* release) {
  *release = false;
  auto it = grants_.find(grant);
  if (it == grants_.end()) return std::nullopt;
  if (it->second.abandoned) {
    *release = true;
    grants_.erase(it);
    return std::nullopt;
  }
  it->second.answered = true;
  return it->second.asker;
}

void GrantTable::Refused(uint64_t grant) { grants_.erase(grant); }

std::optional<GrantRelease> GrantTable::Freed(uint64_t grant, uint32_t slot) {
  auto it = grants_.find(grant);
  if (it == grants_.end() || it->second.kept_fd >= 0 || it->second.asker.slot != slot) return std::nullopt;
  if (!it->second.answered) {
    it->second.abandoned = true;
    return std::nullopt;
  }
  GrantRelease release{it->second.asker.device, grant};
  grants_.erase(it);
  return release;
}

bool GrantTable::Kept(uint64_t grant, uint32_t slot, int fd) {
  auto it = grants_.find(grant);
  if (it == grants_.end() || it->second.asker.slot != slot || it->second.kept_fd >= 0) return false;
  it->second.kept_fd = fd;
  by_fd_[fd] = grant;
  return true;
}

std::optional<GrantRelease> GrantTable::Closed(int fd) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  const uint64_t grant = it->second;
  by_fd_.erase(it);
  auto g = grants_.find(grant);
  if (g == grants_.end()) return std::nullopt;
  GrantRelease release{g->second.asker.device, grant};
  grants_.erase(g);
  return release;
}

std::vector<GrantRelease> GrantTable::WorkerGone(uint32_t slot, uint32_t generation) {
  std::vector<GrantRelease> released;
  for (auto it = grants_.begin(); it != grants_.end();) {
    const Asker& a = it->second.asker;
    if (it->second.kept_fd >= 0 || a.slot != slot || a.generation != generation) {
      ++it;
    } else if (!it->second.answered) {
      it->second.abandoned = true;
      ++it;
    } else {
      released.push_back({a.device, it->first});
      it = grants_.erase(it);
    }
  }
  return released;
}

void GrantTable::OwnerGone(uint32_t device) {
  for (auto it = grants_.begin(); it != grants_.end();) {
    if (it->second.asker.device == device) {
      if (it->second.kept_fd >= 0) by_fd_.erase(it->second.kept_fd);
      it = grants_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace warmpool::supervisor
