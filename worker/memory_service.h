// The memory engines allocate from, as this worker hands it to them (wp_device_memory), and what
// stands behind it:
// - device memory: on the host backend memfd regions counted against the budget; on cuda the
//   device, whose shareable memory only the device's owner process creates. There an allocation
//   asks the supervisor for a grant (RequestGrant) and waits until the serving thread, which reads
//   the channel, passes the answer on (OnGrant).
// - offers (host backend): memory the supervisor kept from a model that left and offers to the
//   job that needs as much (WorkerOffer). The job's allocation reuses those pages instead of
//   faulting in fresh ones; an offer its job does not use is closed when the job ends.
// - parked copies: host memory outside the device budget, on both backends.
//
// Threads: the load thread allocates (load, attach, unpark) and waits for grants; the serving
// thread copies weights out to park them and passes on grants and offers as they arrive; both
// free, since an engine closes on whichever thread lets go of it last. grant_mutex_ and
// offers_mutex_ are each held only inside one call, never together, and no other lock is taken
// under them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "devmem/host_memory.h"
#ifdef WARMPOOL_HAVE_CUDA
#include "devmem/cuda_service.h"
#endif
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "worker/fault_injector.h"
#include "worker/options.h"
#include "worker/outbox.h"

namespace warmpool::worker {

class MemoryService {
 public:
  MemoryService(const WorkerOptions& options, Outbox& outbox);
  ~MemoryService();  // closes grants that came after their allocation stopped waiting
  MemoryService(const MemoryService&) = delete;
  MemoryService& operator=(const MemoryService&) = delete;

  // Picks the device memory engines allocate from: the host backend, or (cuda) opens the device.
  // Worker::Start, before either thread runs.
  Status Open();
  // What engines are opened with (Engine::Open): it outlives every engine.
  const wp_device_memory* engines() const { return &engines_; }

  // --- serving thread ---
  // The thread that reads the channel: an allocation there would wait for a grant only that
  // thread can read, so RequestGrant refuses it.
  void SetReaderThread(std::thread::id reader) { reader_thread_ = reader; }
  void OnGrant(const v1::WorkerAllocated& reply, int fd);
  // Takes fd over. At most kMaxOffers wait; a surplus one is closed.
  void StoreOffer(uint64_t job, int fd);
  // The supervisor let go of the weights behind these inodes: their kept mappings can go.
  void ForgetMappings(const std::vector<uint64_t>& inodes) { host_memory_.ForgetMappings(inodes); }
  // A park: the weights copied into host memory (into the memory offered to the job, if any); the
  // descriptor of the copy is the caller's.
  Result<int> CopyToHost(const wp_region& weights, uint64_t job);
  // A park: a GPU's KV pool copied into a sealed host memfd (the caller's).
  Result<int> CopyCacheToHost(const wp_region& cache) { return HostMemory::CopyToSealedHost(engines_, cache); }

  // --- load thread ---
  // The job the load thread runs now (0: none): its allocations take the memory offered to it.
  void SetLoadThreadJob(uint64_t job) { load_thread_job_.store(job); }
  // The faults of the load that allocates now (nullptr: none), for the load.after_alloc point.
  void SetAllocFaults(JobFaults* faults) { alloc_faults_ = faults; }
  // Unpark: a fresh device region filled from the parked copy in host_fd.
  Result<wp_region> CopyToDevice(int host_fd, uint64_t bytes);
  // The weights region of fd went to the supervisor: its mapping outlives the engine's free
  // (HostMemory::KeepMappingOf; host backend only).
  void KeepMappingOf(int fd);
  // The grant holding a region (cuda), 0 on the host backend.
  uint64_t GrantOf(const wp_region& region) const;

  // --- either thread ---
  // Closes the memory offered to a job that ended without using it.
  void DropOffer(uint64_t job);
  // The channel is gone (shutdown): an allocation waiting for a grant fails now, and later ones
  // fail at once.
  void CloseGrants();

 private:
  // The supervisor's answer to a WorkerAllocate: the grant, or why there is none.
  struct GrantReply {
    Status status;
    uint64_t grant = 0;
    int fd = -1;
    uint64_t bytes = 0;
  };
  // cuda: device memory from the device's owner, through the supervisor. Waits for the answer.
  GrantReply RequestGrant(uint64_t bytes);
  int TakeOffer(uint64_t job);

  // The engines' service: the device's, plus offers and the load.after_alloc fault point.
  static wp_status AllocWithFaults(void* ctx, uint64_t bytes, wp_region* out);
  static void FreeRegion(void* ctx, wp_region* region);
  static wp_status ImportRegion(void* ctx, int handle, uint64_t bytes, wp_region* out);
  static wp_status WriteRegion(void* ctx, const wp_region* region, uint64_t offset, const void* source, uint64_t bytes);
  static wp_status ReadRegion(void* ctx, const wp_region* region, uint64_t offset, void* destination, uint64_t bytes);

  const WorkerOptions& options_;
  Outbox& outbox_;
  HostMemory host_memory_;  // the device on the host backend; parked copies on both
#ifdef WARMPOOL_HAVE_CUDA
  std::unique_ptr<CudaMemory> cuda_memory_;
#endif
  const wp_device_memory* device_ = nullptr;  // what engines_ forwards to
  wp_device_memory engines_;

  // cuda: device memory asked of the supervisor and not yet taken by its allocation, by request id.
  std::mutex grant_mutex_;
  std::condition_variable grant_cv_;
  uint64_t next_grant_request_ = 1;
  std::unordered_map<uint64_t, GrantReply> grants_;
  bool grants_closed_ = false;  // the channel is gone: no grant will come
  // Set before the serving thread reads its first frame, and so before any job reaches the load
  // thread (the queue's lock orders the two).
  std::thread::id reader_thread_;

  static constexpr size_t kMaxOffers = 4;
  std::mutex offers_mutex_;
  std::map<uint64_t, int> offers_;
  std::atomic<uint64_t> load_thread_job_{0};
  JobFaults* alloc_faults_ = nullptr;  // load thread only
};

}  // namespace warmpool::worker
