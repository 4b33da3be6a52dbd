#include "supervisor/host_memory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "common/units.h"
#include "ipc/error_proto.h"
#include "ipc/framing.h"
#include "supervisor/worker_pool.h"

namespace warmpool::supervisor {

Status HostMemory::Start(WorkerPool* workers) {
  workers_ = workers;
  return OkStatus();
}

void HostMemory::Release(int fd, bool reusable) {
  if (reusable) return cache_.Keep(fd);
  // The worker that allocated it may keep a mapping of it: named to the workers, it goes too.
  struct stat st {};
  const bool known = fstat(fd, &st) == 0;
  close(fd);
  if (known) ForgetMappings({static_cast<uint64_t>(st.st_ino)});
}

void HostMemory::BeforeAllocatingJob(uint32_t slot, uint64_t job, uint64_t bytes, const shm::ModelIndex& index) {
  // Take before trimming: the core has just counted this job's bytes as used, so under a full
  // budget used + kept passes it — and the kept region that made room (the model this load
  // evicted) is the one to reuse, not the first to go. Once it is taken, the rest is trimmed.
  uint64_t size = 0;
  const int fd = cache_.Take(bytes, &size);
  AfterActions(index);
  if (fd < 0) return;
  // A larger region shrinks now, not when the worker gets to the job: its tail is counted nowhere
  // once it has left the cache (the core counts `bytes`).
  if (size > bytes && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return;
  }
  spdlog::info("worker {}: job {} reuses {} of freed memory for {}", slot, job, FormatBytes(size), FormatBytes(bytes));
  v1::WorkerEnvelope offer;
  offer.mutable_offer()->set_job(job);
  offer.mutable_offer()->set_bytes(bytes);
  workers_->SendFrame(slot, ipc::Frame(offer), {fd});
  close(fd);  // the channel sends its own copy (or none, to a worker that is dying)
}

void HostMemory::AfterActions(const shm::ModelIndex& index) {
  if (cache_.size() == 0) return;
  const uint64_t used = index.DeviceUsed(0), budget = index.DeviceBudget(0);
  ForgetMappings(cache_.TrimTo(budget > used ? budget - used : 0));
}

void HostMemory::HandedOver() { ForgetMappings(cache_.TrimTo(0)); }

void HostMemory::Describe(v1::StatusReply& status) const {
  if (status.devices_size() == 0) return;
  status.mutable_devices(0)->set_kept_bytes(cache_.bytes());
  status.mutable_devices(0)->set_kept_regions(static_cast<uint32_t>(cache_.size()));
}

bool HostMemory::OnWorkerMessage(uint32_t slot, const v1::WorkerEnvelope& message) {
  if (message.has_free()) return true;  // nothing is granted here: nothing to free
  if (!message.has_allocate()) return false;
  v1::WorkerEnvelope reply;
  v1::WorkerAllocated* a = reply.mutable_allocated();
  a->set_request(message.allocate().request());
  ipc::SetError(a->mutable_error(),
                Error(Code::kFailedPrecondition, "device memory is granted on the cuda backend only"));
  workers_->SendFrame(slot, ipc::Frame(reply));
  return true;
}

void HostMemory::OnWeights(uint32_t slot, const v1::WorkerLoadDone& done, int) {
  if (done.grant() != 0) {
    spdlog::warn("worker {} named grant {} for its weights, which it was not given", slot, done.grant());
  }
}

void HostMemory::ForgetMappings(const std::vector<uint64_t>& inodes) {
  if (inodes.empty()) return;
  v1::WorkerEnvelope gone;
  for (uint64_t inode : inodes) gone.mutable_mappings_gone()->add_inodes(inode);
  workers_->SendFrameToAll(ipc::Frame(gone));
}

}  // namespace warmpool::supervisor
