// The serving thread's loop: reads the channel and routes each message; parks run here.
#include "worker/serving.h"

#include <unistd.h>

#include <thread>

#include <spdlog/spdlog.h>

#include "ipc/descriptors.h"
#include "ipc/error_proto.h"
#include "ipc/exit_status.h"

namespace warmpool::worker {

Serving::Serving(const WorkerOptions& options, ipc::BlockingChannel& channel, Outbox& outbox, MemoryService& memory,
                 InflightMarks& marks, ModelTable& models, LoadThread& load_thread)
    : options_(options),
      channel_(channel),
      outbox_(outbox),
      memory_(memory),
      marks_(marks),
      models_(models),
      load_thread_(load_thread) {}

Status Serving::ReadIncoming(Incoming& in) {
  in.fd = -1;
  Status s = channel_.Read(in.message);
  if (!s.ok()) return s;
  // ipc/descriptors.h says which messages carry descriptors: exactly that many queued are this one's.
  const v1::WorkerEnvelope& m = in.message;
  if (m.has_infer()) {  // a client's region memfds, input's first
    in.regions = RegionFds{};
    if (m.infer().has_input_region()) in.regions.input = channel_.TakeFd();
    if (m.infer().has_output_region()) in.regions.output = channel_.TakeFd();
    if (m.infer().kv_source()) {
      // try_emplace, not []: a new entry's value must be -1, never 0 (a descriptor number).
      auto [kept, fresh] = kv_sources_.try_emplace(m.infer().job(), -1);
      if (!fresh && kept->second >= 0) close(kept->second);  // a job id sent twice: the later frame's
      kept->second = channel_.TakeFd();
    }
  } else if (m.has_attach()) {  // the weights' region, then the KV cache's
    if (m.attach().weights().weight_bytes() > 0) in.fd = channel_.TakeFd();
    in.cache = m.attach().kv_cache() ? channel_.TakeFd() : -1;
  } else if (ipc::DescriptorsCarried(m) > 0) {
    in.fd = channel_.TakeFd();
  }
  return OkStatus();
}

int Serving::TakeKvSource(uint64_t job) {
  auto it = kv_sources_.find(job);
  if (it == kv_sources_.end()) return -1;
  const int fd = it->second;
  kv_sources_.erase(it);
  return fd;
}

int Serving::Run() {
  memory_.SetReaderThread(std::this_thread::get_id());
  Status read_error;  // met while gathering a batch: reported once the batch is answered
  for (;;) {
    Incoming in;
    Status s = read_error;
    if (!deferred_.empty()) {  // read before, while something else ran: in arrival order
      in = std::move(deferred_.front());
      deferred_.pop_front();
    } else if (s.ok()) {
      s = ReadIncoming(in);
    }
    if (!s.ok()) {
      if (s.code() == Code::kUnavailable) return ipc::kChildStopped;  // supervisor closed the channel
      spdlog::error("worker {}: bad message from the supervisor: {}", options_.slot, s.ToString());
      return ipc::kChildFailed;
    }
    if (HandleControl(in)) continue;
    v1::WorkerEnvelope& message = in.message;
    switch (message.body_case()) {
      case v1::WorkerEnvelope::kInfer: {
        const v1::WorkerInfer& infer = message.infer();
        if (infer.has_generate()) {  // a language model's generation: batched by its engine's steps
          HandleGenerate(std::move(*message.mutable_infer()));
          if (!read_error_.ok()) read_error = read_error_;
          break;
        }
        if (infer.has_embed()) {  // never batched
          HandleEmbed(infer);
          if (!read_error_.ok()) read_error = read_error_;
          break;
        }
        if (infer.inputs_size() > 0) {  // typed tensors: never batched
          HandleInferTensors(infer);
          if (!read_error_.ok()) read_error = read_error_;
          break;
        }
        if (infer.has_input_region() || infer.has_output_region()) {  // never batched
          HandleInfer(infer, in.regions);
          break;
        }
        std::vector<v1::WorkerInfer> batch;
        batch.push_back(std::move(*message.mutable_infer()));
        read_error = GatherBatch(batch);
        HandleInfers(batch);
        break;
      }
      case v1::WorkerEnvelope::kUnload: load_thread_.Unload(std::move(*message.mutable_unload())); break;
      case v1::WorkerEnvelope::kPark: HandlePark(message.park()); break;
      case v1::WorkerEnvelope::kLoad: load_thread_.QueueLoad(std::move(*message.mutable_load()), in.fd); break;
      case v1::WorkerEnvelope::kAttach: load_thread_.QueueAttach(std::move(*message.mutable_attach()), in.fd, in.cache); break;
      default:
        spdlog::error("worker {}: unexpected message {} from the supervisor", options_.slot,
                      static_cast<int>(message.body_case()));
        return ipc::kChildFailed;
    }
  }
}

bool Serving::HandleControl(Incoming& in) {
  v1::WorkerEnvelope& message = in.message;
  const int fd = in.fd;
  switch (message.body_case()) {
    case v1::WorkerEnvelope::kRegionsGone:
      for (uint64_t id : message.regions_gone().regions()) regions_.Forget(id);
      return true;
    case v1::WorkerEnvelope::kMappingsGone:
      memory_.ForgetMappings({message.mappings_gone().inodes().begin(), message.mappings_gone().inodes().end()});
      return true;
    case v1::WorkerEnvelope::kAllocated: memory_.OnGrant(message.allocated(), fd); return true;
    case v1::WorkerEnvelope::kOffer:
      if (fd >= 0) memory_.StoreOffer(message.offer().job(), fd);
      return true;
    case v1::WorkerEnvelope::kCancel: cancelled_.insert(message.cancel().job()); return true;
    default: return false;
  }
}

void Serving::HandlePark(const v1::WorkerPark& request) {
  std::optional<JobMark> mark(std::in_place, marks_, request.job(), request.model());
  v1::WorkerEnvelope reply;
  v1::WorkerParkDone* done = reply.mutable_park_done();
  done->set_job(request.job());
  std::shared_ptr<Engine> engine = models_.Find(request.model());
  int copy = -1;
  int cache_copy = -1;
  Status status;
  if (engine == nullptr) {
    status = Error(Code::kUnavailable, "model {} is not loaded in worker {}", request.model(), options_.slot);
  } else {
    Result<wp_region> weights = engine->ExportWeights();
    if (!weights.ok() || weights->ptr == nullptr) {
      status = Error(Code::kFailedPrecondition, "the model has no weights to park");
    } else {
      Result<int> host = memory_.CopyToHost(*weights, request.job());
      if (!host.ok()) status = host.status();
      else {
        copy = *host;
        done->set_bytes(weights->bytes);
        done->set_copy_shared(true);
        // A GPU's KV pool is device memory too, which parking frees: copied out beside the
        // weights (between steps: this thread runs them), its prefix cache goes with the copy.
        Result<wp_region> cache = engine->ExportCache();
        if (request.cache_copy() && cache.ok() && memory_.GrantOf(*cache) != 0) {
          Result<int> kv = memory_.CopyCacheToHost(*cache);
          if (kv.ok()) {
            cache_copy = *kv;
            done->set_cache_copy(true);
            done->set_cache_copy_bytes(cache->bytes);
          } else {  // the weights park without it: the unparked model's cache starts empty
            spdlog::warn("model {}: its KV cache is not parked with it: {}", request.model(), kv.status().ToString());
          }
        }
      }
    }
  }
  memory_.DropOffer(request.job());  // offered memory the park did not get to use
  outbox_.FaultsFor(request.job(), request.faults()).Hit("park.mid");
  if (!status.ok()) ipc::SetError(done->mutable_error(), status);
  mark.reset();
  std::vector<int> sent;
  for (int fd : {copy, cache_copy}) {
    if (fd >= 0) sent.push_back(fd);
  }
  outbox_.Send(reply, sent);
  for (int fd : sent) close(fd);  // the supervisor got its own descriptors
}

}  // namespace warmpool::worker
