// The load thread: loads, attaches and the unloads queued behind them, one job at a time. Loads
// run here so that a long one never stalls inference on the models already here; an attach runs
// here because it may copy a parked model into device memory, and on cuda waits for device memory
// from the owner, which must never happen on the thread that reads the channel (the answer comes
// on it).
//
// One model's jobs run in the order they came (the supervisor relies on it): an unload is queued
// here when a load or attach of its model is queued or running here, and runs at once on the
// serving thread otherwise. jobs_of_ counts those jobs per model; a job's count drops just before
// its reply is sent, so an unload the supervisor sends after reading that reply is never queued
// behind nothing.
//
// Threads: the serving thread queues (QueueLoad, QueueAttach, Unload) and the load thread runs the
// queue. mutex_ guards the queue, the counts and stopping_, and is never held while a job runs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/status.h"
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "worker/fault_injector.h"
#include "worker/inflight_marks.h"
#include "worker/memory_service.h"
#include "worker/model_table.h"
#include "worker/options.h"
#include "worker/outbox.h"

namespace warmpool::worker {

// The sizes and shape an engine reports, into the description a load or attach answers with.
void DescribeEngine(const Engine& engine, v1::ModelWeights* weights);
// The engine's KV cache into a load's reply: its blocks (kv_usage), and its region when it has one
// another process can map (cache_shared set, its descriptor, the engine's own, after the others in
// `shared`).
void ShareCache(Engine& engine, const MemoryService& memory, v1::WorkerLoadDone& done, std::vector<int>& shared);

class LoadThread {
 public:
  LoadThread(const WorkerOptions& options, Outbox& outbox, MemoryService& memory, InflightMarks& marks,
             ModelTable& models);
  ~LoadThread();  // stops and joins (if not done already)
  LoadThread(const LoadThread&) = delete;
  LoadThread& operator=(const LoadThread&) = delete;

  void Start();

  // --- serving thread ---
  // file: the model file the supervisor opened (-1 for engines without one); taken over.
  void QueueLoad(v1::WorkerLoad request, int file);
  // weights_fd: the shared weights, or the parked copy to unpark from; taken over.
  void QueueAttach(v1::WorkerAttach request, int weights_fd, int cache_fd);
  // Runs the unload on the calling thread, or queues it behind its model's jobs here.
  void Unload(v1::WorkerUnload request);

  // --- shutdown (Worker's destructor) ---
  // A running load gives up at its next progress report; queued jobs never run.
  void Stop();
  // Waits for the thread to end; closes the descriptors of the jobs it never ran.
  void Join();

 private:
  struct Job {
    std::optional<v1::WorkerLoad> load;
    std::optional<v1::WorkerAttach> attach;
    std::optional<v1::WorkerUnload> unload;
    int fd = -1;  // the attach's weights region or the load's model file, owned by the job
    int cache = -1;  // the attach's KV cache region (WorkerAttach.kv_cache), owned by the job
  };
  void Queue(Job job, uint32_t model);
  void Loop();
  bool Stopping();
  // A job of the model is done here: called just before its reply is sent.
  void JobDone(uint32_t model);

  // A load (worker/load.cc): reads the file (then closes it) and replies.
  void RunLoad(const v1::WorkerLoad& request, int file);
  // The load itself: fills done (and shared, the weights' handle) or says why not.
  // shared: the descriptors the reply carries (ipc/descriptors.h), the engine's own.
  Status Load(const v1::WorkerLoad& request, int file, JobFaults& faults, v1::WorkerLoadDone& done,
              std::vector<int>& shared);
  // Serves a model from weights another worker loaded, or from its parked copy (request.copy()).
  void Attach(const v1::WorkerAttach& request, int weights_fd, int cache_fd);
  void AdoptCache(Engine& engine, const v1::WorkerAttach& request, int cache_fd);
  // on_load_thread: it was queued here (see Unload).
  void RunUnload(const v1::WorkerUnload& request, bool on_load_thread);

  const WorkerOptions& options_;
  Outbox& outbox_;
  MemoryService& memory_;
  InflightMarks& marks_;
  ModelTable& models_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::unordered_map<uint32_t, uint32_t> jobs_of_;  // model -> its jobs queued or running here
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace warmpool::worker
