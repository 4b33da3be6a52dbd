// The cuda backend's device-memory grants, as the shell tracks them. Only a device's owner
// process creates shareable device memory; a worker asks for it (WorkerAllocate), the shell asks
// the owner and hands the worker what the owner made. A grant is released to its owner when
// nobody needs it any more:
//
//   - a worker's grant that never became a model's weights: when the worker frees it, or dies
//     (a grant the owner has not answered yet is released when it answers: a release sent before
//     would find nothing, and the allocation would stay with the owner for good);
//   - a model's weights (the grant named by a load's reply, whose descriptor the core now holds):
//     when the core closes that descriptor — never because a worker died, which is the point;
//   - all of a device's grants when its owner dies: they died with it.
//
// Pure bookkeeping: the shell sends what the table returns. Grant ids are unique per daemon.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace warmpool::supervisor {

struct GrantRelease {
  uint32_t device = 0;
  uint64_t grant = 0;
};

class GrantTable {
 public:
  // A worker asks for memory: the new grant's id (to send to the owner as the allocation id).
  uint64_t Ask(uint32_t device, uint32_t slot, uint32_t generation, uint64_t request, uint64_t bytes = 0);
  // Bytes asked for by a worker and not (yet) a model's weights: what it holds for itself.
  uint64_t Unkept(uint32_t slot, uint32_t generation) const;

  struct Asker {
    uint32_t device = 0;
    uint32_t slot = 0;
    uint32_t generation = 0;
    uint64_t request = 0;
  };
  // The owner answered. Its asker, to hand the grant to; nullopt when nobody wants it any more:
  // release it then if it was allocated (`release` says so) — unless it is unknown (its owner died).
  std::optional<Asker> Answered(uint64_t grant, bool* release);
  // The owner could not allocate: the grant is forgotten.
  void Refused(uint64_t grant);

  // Worker `slot` no longer maps the grant: released unless it holds a model's weights (or is not
  // that worker's to free).
  std::optional<GrantRelease> Freed(uint64_t grant, uint32_t slot);
  // A load's reply named the grant as the model's weights, now held by the core as descriptor fd.
  // False when the grant is unknown (its owner died, or the worker that asked for it is not the
  // one replying): the weights are not backed by anything this table will release.
  bool Kept(uint64_t grant, uint32_t slot, int fd);
  // The core closed a descriptor: the grant it kept, if any, is released.
  std::optional<GrantRelease> Closed(int fd);
  // The worker died: its grants that are not a model's weights are released.
  std::vector<GrantRelease> WorkerGone(uint32_t slot, uint32_t generation);
  // The owner died: every grant of the device is gone (nothing to release).
  void OwnerGone(uint32_t device);

  size_t size() const { return grants_.size(); }

 private:
  struct Grant {
    Asker asker;
    int kept_fd = -1;        // >= 0 once it holds a model's weights
    bool answered = false;   // the owner said whether it allocated
    bool abandoned = false;  // nobody wants it; released when the owner answers
    uint64_t bytes = 0;
  };
  uint64_t next_ = 1;
  std::unordered_map<uint64_t, Grant> grants_;
  std::unordered_map<int, uint64_t> by_fd_;
};

}  // namespace warmpool::supervisor
