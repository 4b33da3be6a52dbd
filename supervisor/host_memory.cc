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

void HostMemory::Release(int fd, bool keep) {
  // After a takeover the new daemon maps this memory: the core knows (event::HandingOver), and
  // this holds whatever it was told meanwhile.
  if (keep && !handed_over_) return cache_.Keep(fd);
  // The worker that allocated it may keep a mapping of it: named to the workers, it goes too.
  struct stat st {};
  const bool known = fstat(fd, &st) == 0;
  close(fd);
  if (known) ForgetMappings({static_cast<uint64_t>(st.st_ino)});
}

void HostMemory::Offer(uint32_t slot, uint64_t job, uint64_t bytes, int fd) {
  std::vector<uint64_t> gone;
  const int region = cache_.Take(fd, bytes, gone);
  ForgetMappings(gone);
  if (region < 0) return;  // the job allocates fresh memory
  spdlog::info("worker {}: job {} reuses {} of freed memory", slot, job, FormatBytes(bytes));
  v1::WorkerEnvelope offer;
  offer.mutable_offer()->set_job(job);
  offer.mutable_offer()->set_bytes(bytes);
  workers_->SendFrame(slot, ipc::Frame(offer), {region});
  close(region);  // the channel sends its own copy (or none, to a worker that is dying)
}

void HostMemory::DropKept(int fd) {
  if (std::optional<uint64_t> inode = cache_.Drop(fd)) ForgetMappings({*inode});
}

void HostMemory::HandedOver() {
  handed_over_ = true;
  ForgetMappings(cache_.DropAll());
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

void HostMemory::OnKept(uint32_t slot, uint64_t grant, int, const char* what) {
  if (grant != 0) spdlog::warn("worker {} named grant {} for its {}, which it was not given", slot, grant, what);
}

void HostMemory::ForgetMappings(const std::vector<uint64_t>& inodes) {
  if (inodes.empty()) return;
  v1::WorkerEnvelope gone;
  for (uint64_t inode : inodes) gone.mutable_mappings_gone()->add_inodes(inode);
  workers_->SendFrameToAll(ipc::Frame(gone));
}

}  // namespace warmpool::supervisor
