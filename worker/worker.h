// warmpool-worker: one process per (device, slot), started by warmpoold with fork+exec. It holds
// engines and executes load / infer / unload for the supervisor over an inherited socketpair.
//
// Threads: the main thread reads the channel and serves infer and unload in arrival order; loads
// run on a load thread so that a long load never stalls inference on the models already here.
// Both write replies through the channel, whose writes are serialised.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "devmem/host_memory.h"
#ifdef WARMPOOL_HAVE_CUDA
#include "devmem/cuda_service.h"
#endif
#include "engines/builtin.h"
#include "ipc/blocking_channel.h"
#include "ipc/warmpool.pb.h"
#include "shm/inflight.h"
#include "shm/segment.h"
#include "worker/client_regions.h"
#include "worker/fault_injector.h"

namespace warmpool::worker {

// The supervisor's answer to a WorkerAllocate: the grant, or why there is none.
struct OwnerGrantReply {
  Status status;
  uint64_t grant = 0;
  int fd = -1;
  uint64_t bytes = 0;
};

struct WorkerOptions {
  int channel_fd = 3;
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint32_t device = 0;
  std::string instance = "default";
  uint64_t budget_bytes = 0;
  uint32_t max_frame_bytes = 64u << 20;
  std::string engine_dir;  // engine plugins: <engine_dir>/<engine>.so; empty: built-ins only
  std::string backend = "host";  // host | cuda
  std::string sharing = "vmm";   // cuda: how the device's owner shares memory (vmm | legacy)
};

class Worker {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();
  // Attaches the segment and says hello; an error here is fatal configuration (exit code 2).
  Status Start();
  // Serves until the supervisor closes the channel. Returns the process exit code.
  int Run();

 private:
  // A job for the load thread: a load, or an attach (which may copy a parked model into device
  // memory, and on cuda waits for device memory from the owner: never on the channel's reader).
  // An unload goes there too when a load or attach of its model is still there before it: one
  // model's jobs run in the order they came (the supervisor relies on it).
  struct LoadJob {
    std::optional<v1::WorkerLoad> load;
    std::optional<v1::WorkerAttach> attach;
    std::optional<v1::WorkerUnload> unload;
    int fd = -1;  // the attach's weights region or the load's model file, owned by the job
  };
  // Picks the device memory engines allocate from: the host backend, or (cuda) the device.
  Status OpenDeviceMemory();
  // The memfds of a client's regions that came with an inference (WorkerInfer.input_region,
  // output_region): owned by whoever holds them, -1 when none.
  struct RegionFds {
    int input = -1;
    int output = -1;
    void Close();
  };
  // Runs one request alone; takes (and closes) its regions' descriptors.
  void HandleInfer(const v1::WorkerInfer& request, RegionFds regions);
  void HandleInfer(const v1::WorkerInfer& request) { HandleInfer(request, RegionFds()); }
  // A frame from the supervisor with the descriptor it carries (-1: none).
  struct Incoming {
    v1::WorkerEnvelope message;
    int fd = -1;
    RegionFds regions;  // an inference's regions
  };
  Status ReadIncoming(Incoming& in);
  // Dynamic batching (worker/batching.cc). Adds to `batch` (one request so far) the requests for
  // the same model that reach this worker now, or within the first one's batch_delay_us, up to the
  // engine's max_batch rows; a frame read that does not join goes to `ahead`. A read error ends
  // the gathering and is returned.
  Status GatherBatch(std::vector<v1::WorkerInfer>& batch, std::optional<Incoming>& ahead);
  // Answers each request: one engine call for all of them when they can share one.
  void HandleInfers(std::vector<v1::WorkerInfer>& batch);
  // on_load_thread: queued behind its model's load or attach (see LoadJob).
  void HandleUnload(const v1::WorkerUnload& request, bool on_load_thread);
  // A load-thread job of the model is done: called just before its reply is sent, so that an
  // unload the supervisor sends after reading the reply is never queued behind nothing.
  void LoadThreadJobDone(uint32_t model);
  // Serves a model from weights another worker loaded (the supervisor kept their handle).
  void HandleAttach(const v1::WorkerAttach& request, int weights_fd);
  // Copies a model's weights into host memory (the parked copy) and hands it to the supervisor.
  void HandlePark(const v1::WorkerPark& request);
  // Unpark: a fresh device region filled from the host copy in host_fd.
  Result<wp_region> CopyToDevice(int host_fd, uint64_t bytes);
  // cuda: device memory from the device's owner, through the supervisor (load thread only).
  OwnerGrantReply RequestGrant(uint64_t bytes);
  void OnGrant(const v1::WorkerAllocated& reply, int fd);
  void LoadLoop();
  // A load (worker/load.cc): `file` is the model file the supervisor opened (-1 for engines
  // without one), read through and closed here.
  void RunLoad(const v1::WorkerLoad& request, int file);
  // The load itself: fills done (and shared, the weights' handle) or says why not.
  Status Load(const v1::WorkerLoad& request, int file, JobFaults& faults, v1::WorkerLoadDone& done,
              int& shared);
  void Send(const v1::WorkerEnvelope& message, const std::vector<int>& fds = {});
  // An in-flight marker for a job other than inference (load, attach, unload, park), held while
  // the job runs: if this process dies, the marker tells the supervisor which job was running.
  class JobMark {
   public:
    JobMark(Worker& worker, uint64_t job, uint32_t model);
    ~JobMark();
   private:
    Worker& worker_;
    Result<uint32_t> slot_;
  };
  // The faults granted to a job, reporting their firing for it.
  JobFaults FaultsFor(uint64_t job, const google::protobuf::RepeatedPtrField<v1::Fault>& faults);
  // The engines' memory service: the host backend, plus the load.after_alloc fault point.
  static wp_status AllocWithFaults(void* ctx, uint64_t bytes, wp_region* out);
  static void FreeRegion(void* ctx, wp_region* region);
  // The weights region of fd went to the supervisor: its mapping outlives the engine's free
  // (HostMemory::KeepMappingOf).
  void KeepMappingOf(int fd);
  static wp_status ImportRegion(void* ctx, int handle, uint64_t bytes, wp_region* out);
  static wp_status WriteRegion(void* ctx, const wp_region* region, uint64_t offset, const void* source, uint64_t bytes);
  static wp_status ReadRegion(void* ctx, const wp_region* region, uint64_t offset, void* destination, uint64_t bytes);
  // The grant holding a region (cuda), 0 on the host backend.
  uint64_t GrantOf(const wp_region& region) const;

  WorkerOptions options_;
  ipc::BlockingChannel channel_;
  HostMemory host_memory_;  // the device on the host backend; parked copies on both
#ifdef WARMPOOL_HAVE_CUDA
  std::unique_ptr<CudaMemory> cuda_memory_;
#endif
  const wp_device_memory* device_ = nullptr;  // what the engines' service forwards to
  wp_device_memory memory_service_;

  // cuda: device memory asked of the supervisor and not yet granted, by request id.
  std::mutex grant_mutex_;
  std::condition_variable grant_cv_;
  uint64_t next_grant_request_ = 1;
  std::unordered_map<uint64_t, OwnerGrantReply> grants_;
  bool grants_closed_ = false;  // the channel is gone: no grant will come
  std::thread::id reader_thread_;  // reads the channel: must never wait for a grant
  JobFaults* load_faults_ = nullptr;  // load thread only: the faults of the load that allocates now

  // Host backend: memory to reuse (WorkerOffer), by the job it is offered to. The reader thread
  // stores an offer; the load thread takes it when that job allocates, or closes it when the job
  // ends without allocating. At most kMaxOffers wait (older ones are closed).
  void StoreOffer(uint64_t job, int fd);
  int TakeOffer(uint64_t job);
  void DropOffer(uint64_t job);
  static constexpr size_t kMaxOffers = 4;
  std::mutex offers_mutex_;
  std::map<uint64_t, int> offers_;
  std::atomic<uint64_t> load_thread_job_{0};  // the job the load thread runs now (0: none)
  shm::SharedSegment segment_;
  std::unique_ptr<shm::InflightTable> inflight_;

  ClientRegions regions_;  // reader thread only
  // Reused by every inference (serving thread only), so requests do not allocate.
  std::vector<float> input_;
  std::vector<float> output_;

  std::mutex models_mutex_;
  std::unordered_map<uint32_t, std::shared_ptr<Engine>> models_;

  std::mutex load_mutex_;
  std::condition_variable load_cv_;
  std::deque<LoadJob> load_queue_;
  std::unordered_map<uint32_t, uint32_t> load_thread_jobs_;  // model -> its jobs queued or running there
  bool stopping_ = false;
  std::thread load_thread_;
};

}  // namespace warmpool::worker
