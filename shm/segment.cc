#include "shm/segment.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

namespace warmpool::shm {
namespace bip = boost::interprocess;

namespace {

uint64_t AlignUp(uint64_t value) { return (value + 63) & ~uint64_t{63}; }

struct Offsets {
  uint64_t models, workers, inflight, stats, total;
};

Offsets ComputeOffsets(const Limits& limits) {
  Offsets o{};
  o.models = AlignUp(sizeof(SegmentHeader));
  o.workers = AlignUp(o.models + uint64_t{limits.max_models} * sizeof(ModelRecord));
  o.inflight = AlignUp(o.workers + uint64_t{limits.max_workers} * sizeof(WorkerRecord));
  o.stats = AlignUp(o.inflight + uint64_t{limits.max_inflight} * sizeof(InflightSlot));
  o.total = AlignUp(o.stats + sizeof(PoolStats) + uint64_t{limits.max_models} * sizeof(ModelStats));
  return o;
}

bool ProcessAlive(int64_t pid) {
  if (pid <= 0) return false;
  return kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

// The supervisor a segment names: its pid and start time, read from the raw header so that a
// segment of another layout version (an older daemon still running) is judged too.
struct Owner {
  int64_t pid = 0;
  uint64_t start_ticks = 0;  // 0: not recorded (layout before 3)
};
std::optional<Owner> ReadOwner(const std::string& name) {
  try {
    bip::shared_memory_object object(bip::open_only, name.c_str(), bip::read_only);
    bip::mapped_region region(object, bip::read_only);
    if (region.get_size() < sizeof(SegmentHeader)) return std::nullopt;
    const auto* h = static_cast<const SegmentHeader*>(region.get_address());
    if (std::memcmp(h->magic, kMagic, sizeof(kMagic)) != 0) return std::nullopt;
    Owner owner;
    owner.pid = h->supervisor_pid;
    if (h->layout_version >= 3) owner.start_ticks = h->supervisor_start_ticks;
    return owner;
  } catch (const bip::interprocess_exception&) {
    return std::nullopt;
  }
}

}  // namespace

uint64_t SegmentSize(const Limits& limits) { return ComputeOffsets(limits).total; }

uint64_t ProcessStartTicks(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // "pid (comm) state ppid ..." where comm may hold spaces and parentheses: fields count from the
  // last ')'. starttime is field 22, the 20th after it.
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; i++) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

bool SupervisorAlive(int64_t pid, uint64_t start_ticks) {
  if (!ProcessAlive(pid)) return false;
  // The pid may belong to another process by now: the start time tells them apart.
  return start_ticks == 0 || ProcessStartTicks(pid) == start_ticks;
}

Result<SegmentView> SegmentView::Format(std::span<std::byte> bytes, const Limits& limits,
                                        const std::vector<uint64_t>& device_budgets,
                                        int64_t supervisor_pid) {
  const size_t device_count = device_budgets.size();
  if (limits.max_models == 0 || limits.max_models >= kNil || limits.max_workers == 0 ||
      limits.max_workers > 0xFFFF || limits.max_inflight == 0) {
    return Error(Code::kInvalidArgument,
                 "segment limits out of range: max_models {}, max_workers {} (1..65535), "
                 "max_inflight {}",
                 limits.max_models, limits.max_workers, limits.max_inflight);
  }
  if (device_count == 0 || device_count > kMaxDevices) {
    return Error(Code::kInvalidArgument, "device count {} out of range 1..{}", device_count,
                 kMaxDevices);
  }
  Offsets o = ComputeOffsets(limits);
  if (bytes.size() < o.total) {
    return Error(Code::kInvalidArgument, "segment of {} bytes is smaller than the {} needed",
                 bytes.size(), o.total);
  }
  std::memset(bytes.data(), 0, o.total);
  SegmentView view(bytes.data(), bytes.size());
  SegmentHeader& h = view.header();
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.layout_version = kLayoutVersion;
  h.header_size = sizeof(SegmentHeader);
  h.segment_size = bytes.size();
  h.max_models = limits.max_models;
  h.max_workers = limits.max_workers;
  h.max_inflight = limits.max_inflight;
  h.device_count = static_cast<uint32_t>(device_count);
  h.models_offset = o.models;
  h.workers_offset = o.workers;
  h.inflight_offset = o.inflight;
  h.stats_offset = o.stats;
  h.supervisor_pid = supervisor_pid;
  h.lru_head = kNil;
  h.lru_tail = kNil;
  for (size_t d = 0; d < device_count; d++) h.device_budget_bytes[d] = device_budgets[d];
  for (uint32_t i = 0; i < limits.max_models; i++) {
    ModelRecord& m = view.model(i);
    m.worker_slot = kNil;
    m.lru_prev = kNil;
    m.lru_next = kNil;
  }
  for (uint32_t i = 0; i < limits.max_workers; i++) view.worker(i).last_exit = -1;
  return view;
}

Result<SegmentView> SegmentView::Attach(std::span<std::byte> bytes, const std::string& name) {
  if (bytes.size() < sizeof(SegmentHeader)) {
    return Error(Code::kFailedPrecondition,
                 "segment {} is {} bytes, too small to be a warmpool segment: remove it "
                 "(rm /dev/shm/{}) or pass another --instance",
                 name, bytes.size(), name);
  }
  SegmentView view(bytes.data(), bytes.size());
  const SegmentHeader& h = view.header();
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    return Error(Code::kFailedPrecondition,
                 "segment {} is not a warmpool segment (bad magic): pass another --instance", name);
  }
  if (h.layout_version != kLayoutVersion || h.header_size != sizeof(SegmentHeader)) {
    return Error(Code::kFailedPrecondition,
                 "segment {} was made by layout {}, this binary expects {}: stop the old daemon "
                 "or use binaries of the same version",
                 name, h.layout_version, kLayoutVersion);
  }
  Limits limits{h.max_models, h.max_workers, h.max_inflight};
  Offsets o = ComputeOffsets(limits);
  if (h.segment_size != bytes.size() || o.total > bytes.size() || h.models_offset != o.models ||
      h.workers_offset != o.workers || h.inflight_offset != o.inflight ||
      h.stats_offset != o.stats || h.device_count == 0 || h.device_count > kMaxDevices) {
    return Error(Code::kFailedPrecondition,
                 "segment {} has inconsistent sizes (header says {} bytes, mapped {}): it is "
                 "corrupt; stop the daemon and remove /dev/shm/{}",
                 name, h.segment_size, bytes.size(), name);
  }
  return view;
}

ModelRecord& SegmentView::model(uint32_t index) const {
  return reinterpret_cast<ModelRecord*>(base_ + header().models_offset)[index];
}
WorkerRecord& SegmentView::worker(uint32_t slot) const {
  return reinterpret_cast<WorkerRecord*>(base_ + header().workers_offset)[slot];
}
InflightSlot& SegmentView::inflight(uint32_t index) const {
  return reinterpret_cast<InflightSlot*>(base_ + header().inflight_offset)[index];
}
PoolStats& SegmentView::pool_stats() const {
  return *reinterpret_cast<PoolStats*>(base_ + header().stats_offset);
}
ModelStats& SegmentView::model_stats(uint32_t index) const {
  return reinterpret_cast<ModelStats*>(base_ + header().stats_offset + sizeof(PoolStats))[index];
}

struct SharedSegment::Mapping {
  bip::shared_memory_object object;
  bip::mapped_region region;
};

SharedSegment::SharedSegment() = default;
SharedSegment::~SharedSegment() {
  if (owner_ && !name_.empty()) bip::shared_memory_object::remove(name_.c_str());
}
SharedSegment::SharedSegment(SharedSegment&& other) noexcept { *this = std::move(other); }
SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    if (owner_ && !name_.empty()) bip::shared_memory_object::remove(name_.c_str());
    mapping_ = std::move(other.mapping_);
    view_ = other.view_;
    name_ = std::move(other.name_);
    owner_ = other.owner_;
    other.view_ = SegmentView();
    other.owner_ = false;
    other.name_.clear();
  }
  return *this;
}

void SharedSegment::Remove() {
  if (owner_ && !name_.empty()) bip::shared_memory_object::remove(name_.c_str());
  owner_ = false;
}

Result<SharedSegment> SharedSegment::Create(const std::string& instance, const Limits& limits,
                                            const std::vector<uint64_t>& device_budgets,
                                            std::optional<gid_t> observer_group) {
  const unsigned mode = observer_group ? 0640 : 0600;
  std::string name = NameFor(instance);
  // A segment already there is either stale (its supervisor was killed, or its pid now names
  // another process) or in use.
  if (std::optional<Owner> owner = ReadOwner(name)) {
    if (owner->pid != getpid() && SupervisorAlive(owner->pid, owner->start_ticks)) {
      return Error(Code::kFailedPrecondition,
                   "instance \"{}\" is in use by warmpoold pid {} (segment /dev/shm/{}): stop it "
                   "or pass --instance NAME",
                   instance, owner->pid, name);
    }
  }
  bip::shared_memory_object::remove(name.c_str());
  auto mapping = std::make_unique<Mapping>();
  uint64_t size = SegmentSize(limits);
  try {
    bip::permissions perms(mode);
    mapping->object = bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write, perms);
    // The umask may have narrowed the mode given to shm_open; set it exactly. The group gets
    // read access only once the object is theirs, and before it holds anything.
    int fd = mapping->object.get_mapping_handle().handle;
    if (observer_group && fchown(fd, static_cast<uid_t>(-1), *observer_group) != 0) {
      int err = errno;
      bip::shared_memory_object::remove(name.c_str());
      return Error(Code::kFailedPrecondition,
                   "cannot give segment /dev/shm/{} to group {}: {} (the daemon's user must be a "
                   "member of [access] observer_group)",
                   name, *observer_group, std::strerror(err));
    }
    fchmod(fd, mode);
    mapping->object.truncate(static_cast<bip::offset_t>(size));
    mapping->region = bip::mapped_region(mapping->object, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    bip::shared_memory_object::remove(name.c_str());
    return Error(Code::kInternal, "cannot create shared-memory segment /dev/shm/{}: {}", name,
                 e.what());
  }
  std::span<std::byte> bytes(static_cast<std::byte*>(mapping->region.get_address()),
                             mapping->region.get_size());
  Result<SegmentView> view = SegmentView::Format(bytes, limits, device_budgets, getpid());
  if (!view.ok()) {
    bip::shared_memory_object::remove(name.c_str());
    return view.status();
  }
  view->header().supervisor_start_ticks = ProcessStartTicks(getpid());
  SharedSegment segment;
  segment.mapping_ = std::move(mapping);
  segment.view_ = *view;
  segment.name_ = name;
  segment.owner_ = true;
  return segment;
}

Result<SharedSegment> SharedSegment::Open(const std::string& instance, bool read_only) {
  std::string name = NameFor(instance);
  auto mapping = std::make_unique<Mapping>();
  bip::mode_t mode = read_only ? bip::read_only : bip::read_write;
  try {
    mapping->object = bip::shared_memory_object(bip::open_only, name.c_str(), mode);
    mapping->region = bip::mapped_region(mapping->object, mode);
  } catch (const bip::interprocess_exception& e) {
    return Error(Code::kNotFound,
                 "cannot open shared-memory segment /dev/shm/{}: {} (is warmpoold running with "
                 "--instance {}?)",
                 name, e.what(), instance);
  }
  std::span<std::byte> bytes(static_cast<std::byte*>(mapping->region.get_address()),
                             mapping->region.get_size());
  Result<SegmentView> view = SegmentView::Attach(bytes, name);
  if (!view.ok()) return view.status();
  SharedSegment segment;
  segment.mapping_ = std::move(mapping);
  segment.view_ = *view;
  segment.name_ = name;
  segment.owner_ = false;
  return segment;
}

}  // namespace warmpool::shm
