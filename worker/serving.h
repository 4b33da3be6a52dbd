// Serving: the main thread. It is the channel's only reader. In arrival order it answers
// inferences (batched: worker/batching.cc; alone: worker/infer.cc), parks models, and runs the
// unloads that nothing queued on the load thread comes before; it hands loads, attaches and the
// other unloads to the load thread, and to the memory service what the supervisor sends it
// (grants, offers, mappings gone). Everything it owns (client regions, the inference buffers) is
// touched by this thread alone.
#pragma once

#include <unistd.h>


#include <chrono>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "ipc/blocking_channel.h"
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "worker/client_regions.h"
#include "worker/inflight_marks.h"
#include "worker/load_thread.h"
#include "worker/memory_service.h"
#include "worker/model_table.h"
#include "worker/options.h"
#include "worker/outbox.h"

namespace warmpool::worker {

class Serving {
 public:
  Serving(const WorkerOptions& options, ipc::BlockingChannel& channel, Outbox& outbox, MemoryService& memory,
          InflightMarks& marks, ModelTable& models, LoadThread& load_thread);

  // Serves until the supervisor closes the channel. Returns the process exit code.
  int Run();

 private:
  // The memfds of a client's regions that came with an inference (WorkerInfer.input_region,
  // output_region): owned by whoever holds them, -1 when none.
  struct RegionFds {
    int input = -1;
    int output = -1;
    void Close();
  };
  // A frame from the supervisor with the descriptor it carries (-1: none).
  struct Incoming {
    v1::WorkerEnvelope message;
    int fd = -1;
    int cache = -1;     // an attach's KV cache region (WorkerAttach.kv_cache)
    RegionFds regions;  // an inference's regions
  };
  Status ReadIncoming(Incoming& in);
  // Dynamic batching (worker/batching.cc). Adds to `batch` (one request so far) the requests for
  // the same model that reach this worker now (deferred ones first), or within the first one's
  // batch_delay_us, up to the engine's max_batch rows; the first frame that does not join goes
  // back to the front of deferred_, to be handled next. A read error ends the gathering and is
  // returned.
  Status GatherBatch(std::vector<v1::WorkerInfer>& batch);
  // Answers each request: one engine call for all of them when they can share one.
  void HandleInfers(std::vector<v1::WorkerInfer>& batch);
  // Runs one request alone (worker/infer.cc); takes (and closes) its regions' descriptors.
  void HandleInfer(const v1::WorkerInfer& request, RegionFds regions);
  void HandleInfer(const v1::WorkerInfer& request) { HandleInfer(request, RegionFds()); }
  // Typed tensors (worker/infer_tensors.cc): one engine run, alone.
  void HandleInferTensors(const v1::WorkerInfer& request);
  // A language model's generation (worker/generate.cc): chunks as it goes, then the done message.
  // Between steps it reads what the supervisor sent meanwhile: a cancel of this job ends it,
  // control frames are handled, jobs wait in deferred_ (loads and attaches too: an unload before
  // an attach of the same model must not be overtaken by it).
  void HandleGenerate(v1::WorkerInfer request);
  // Continuous batching (worker/generation_batch.cc), for engines that step sequences together:
  // this generation and every other one for the same model that reaches the front of deferred_
  // while it runs share the engine's steps, up to its info.sequences at once; each joins and leaves
  // between steps. Returns when none is left; what waits in deferred_ behind them is next.
  void ServeGenerations(v1::WorkerInfer first, const std::shared_ptr<Engine>& engine);
  // A generate request in the engine's terms (a resumed one's tokens too), pointing into the request
  // and `out`'s storage.
  struct EngineRequest {
    EngineRequest() = default;
    EngineRequest(const EngineRequest&) = delete;
    EngineRequest& operator=(const EngineRequest&) = delete;
    ~EngineRequest() {
      if (kv_source >= 0) close(kv_source);
    }
    wp_generate_request request{};
    std::vector<wp_string> stops, roles, contents;
    std::string conversation;
    int kv_source = -1;  // its descriptor (TakeKvSource), closed with the request
  };
  // Fills out.request from the frame (and out.kv_source, when set, with its size).
  static Status ToEngineRequest(const v1::WorkerInfer& infer, EngineRequest& out);
  // A resumed generation's KV source (WorkerInfer.kv_source): the descriptor that came with the
  // frame, kept by job from its arrival until the job starts (-1: none). The engine maps it while
  // it opens the generation; the job's EngineRequest closes it.
  int TakeKvSource(uint64_t job);
  std::unordered_map<uint64_t, int> kv_sources_;
  void SendGenerateError(uint64_t job, const Status& status);
  // Embeddings (worker/embed.cc): between inputs and pieces of a long one, as a generation between
  // steps (heartbeats, a cancel, the deadline).
  void HandleEmbed(const v1::WorkerInfer& request);
  // Between a long job's steps (worker/generate.cc): what the supervisor sent meanwhile is read
  // (control frames handled, jobs deferred); false when the job was cancelled or the channel is
  // gone (read_error_).
  bool BetweenSteps(uint64_t job);
  // What the supervisor sent while a job runs: control frames handled, jobs to deferred_.
  void ReadWhileBusy();
  // Before a generation or embeddings run: the model loaded here and able (`unable` says why not),
  // the deadline not passed, not cancelled; its in-flight slot taken.
  // oldest_running: the first job of those running beside it (cancels of older jobs are dropped).
  Result<uint32_t> BeginLongJob(const v1::WorkerInfer& request, const std::shared_ptr<Engine>& engine,
                                const Status& unable, uint64_t oldest_running = UINT64_MAX);
  // A heartbeat for the job (a WorkerInferChunk with no chunk) when none went out for a second:
  // the supervisor takes a long job that says nothing for a hung worker.
  void HeartbeatIfDue(uint64_t job, std::chrono::steady_clock::time_point& last_heard);
  // Frames that are no job and need no order among jobs (device memory granted or offered, region
  // and mapping releases, cancels): handled at once, whatever is running. False: a job.
  bool HandleControl(Incoming& in);
  // Copies a model's weights into host memory (the parked copy) and hands it to the supervisor.
  void HandlePark(const v1::WorkerPark& request);

  const WorkerOptions& options_;
  ipc::BlockingChannel& channel_;  // read here only; written through outbox_
  Outbox& outbox_;
  MemoryService& memory_;
  InflightMarks& marks_;
  ModelTable& models_;
  LoadThread& load_thread_;

  ClientRegions regions_;
  // Jobs read while another ran (a generation, a batch being gathered), in arrival order: they
  // come before anything read from the channel after them.
  std::deque<Incoming> deferred_;
  // Jobs the supervisor cancelled (WorkerCancel). Serving jobs run in the order of their ids, so
  // one below the job that starts is over: those are dropped then.
  std::set<uint64_t> cancelled_;
  Status read_error_;  // the channel failed while a generation read it: Run stops
  // Reused by every inference, so requests do not allocate.
  std::vector<float> input_;
  std::vector<float> output_;
};

}  // namespace warmpool::worker
