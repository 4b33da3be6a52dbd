// The segment in two parts, as nginx splits ngx_shmtx_sh_t from ngx_shmtx_t: SegmentView is a
// per-process view over bytes it does not own (a mapping, or a byte vector in tests), and
// SharedSegment owns the POSIX object and its mapping.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "shm/layout.h"
#include "shm/stats.h"

namespace warmpool::shm {

class SegmentView {
 public:
  SegmentView() = default;
  SegmentView(void* base, uint64_t size) : base_(static_cast<std::byte*>(base)), size_(size) {}

  // Writes a fresh header and zeroed tables for limits into bytes of at least SegmentSize(limits);
  // one device per budget (0 = unlimited), 1..kMaxDevices of them.
  static Result<SegmentView> Format(std::span<std::byte> bytes, const Limits& limits,
                                    const std::vector<uint64_t>& device_budgets,
                                    int64_t supervisor_pid);
  // Checks magic, layout version and sizes; the error tells the operator what to do.
  static Result<SegmentView> Attach(std::span<std::byte> bytes, const std::string& name);

  bool valid() const { return base_ != nullptr; }
  std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }
  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(base_); }
  ModelRecord& model(uint32_t index) const;
  WorkerRecord& worker(uint32_t slot) const;
  InflightSlot& inflight(uint32_t index) const;
  PoolStats& pool_stats() const;
  ModelStats& model_stats(uint32_t index) const;
  uint32_t max_models() const { return header().max_models; }
  uint32_t max_workers() const { return header().max_workers; }
  uint32_t max_inflight() const { return header().max_inflight; }

 private:
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
};

// When the process started (clock ticks since boot, /proc/PID/stat field 22); 0 if unknown.
uint64_t ProcessStartTicks(int64_t pid);
// The supervisor that made a segment still runs: its pid is alive and, when recorded, started when
// the segment says (a pid reused by another process is not the supervisor).
bool SupervisorAlive(int64_t pid, uint64_t start_ticks);

// A named POSIX shared-memory object ("/warmpool.<instance>") mapped into this process.
class SharedSegment {
 public:
  SharedSegment();
  ~SharedSegment();
  SharedSegment(SharedSegment&&) noexcept;
  SharedSegment& operator=(SharedSegment&&) noexcept;

  // Creates the segment, mode 0600, or 0640 owned by observer_group so that its members can
  // watch the pool read-only. A stale segment left by a killed supervisor is removed first; one
  // whose supervisor is still alive is refused.
  static Result<SharedSegment> Create(const std::string& instance, const Limits& limits,
                                      const std::vector<uint64_t>& device_budgets,
                                      std::optional<gid_t> observer_group = std::nullopt);
  // Maps an existing segment (read-only for observers such as the chaos harness).
  static Result<SharedSegment> Open(const std::string& instance, bool read_only);
  // Removes the name (the mapping stays valid until this object dies).
  void Remove();

  const SegmentView& view() const { return view_; }
  const std::string& name() const { return name_; }

  static std::string NameFor(const std::string& instance) { return "warmpool." + instance; }

 private:
  struct Mapping;
  std::unique_ptr<Mapping> mapping_;
  SegmentView view_;
  std::string name_;
  bool owner_ = false;
};

}  // namespace warmpool::shm
