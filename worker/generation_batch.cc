// Continuous batching on the serving thread: a model's generations share its engine's steps (engine
// ABI version 7). One step advances every running generation by a token (or its prompt by a piece)
// in one pass of the model, which reads each weight once for all of them; between two steps the
// worker reads what the supervisor sent, and generations join and leave:
//   - a generate request for the same model at the front of deferred_ joins while the engine has a
//     free sequence, unless it is to run alone (WorkerInfer.batch false: a retry after a worker's
//     death, which runs once the batch has ended, and nothing joins it) (the core sends at most that many per worker; one that finds none waits there
//     for the next to end). Only from the front: a job of another kind that arrived first (an
//     unload, a park, another model's request) is answered first, after the batch, and nothing
//     behind it overtakes it;
//   - one the engine refuses for want of room in its KV cache while others run goes back to the
//     supervisor (WorkerInferDone.kv_full), which sends it again where there is room; so does one
//     the engine preempts to make room for older ones (engine ABI version 13), after the chunks it
//     sent, to be resumed after them;
//   - a generation ends when its engine says so (an end token, a stop string, its limit, an error),
//     when it is cancelled (its client left), or when its deadline passes;
//   - a failure of the pass itself ends every generation of it with that error.
// Each generation holds its own in-flight mark, from its start to its end, as one run alone does.
#include <algorithm>
#include <memory>
#include <vector>

#include "ipc/error_proto.h"
#include "worker/generation_stream.h"
#include "worker/serving.h"

namespace warmpool::worker {
namespace {

// The blocks a sequence a step ended needs to go on, when its engine preempted it (engine ABI
// version 13): only one the supervisor said it can resume, ended for want of room. A request that
// does not stream starts over (its client has nothing yet): the least it needs is a block.
uint32_t PreemptedBlocks(Engine& engine, const v1::WorkerInfer& request, const wp_sequence_step& step) {
  if (step.ended == 0 || step.status != WP_RESOURCE_EXHAUSTED || !request.preemptible()) return 0;
  const uint32_t blocks = engine.PreemptedBlocks(step.sequence);
  if (blocks == 0) return 0;
  if (!request.generate().stream()) return 1;
  const std::optional<Engine::KvCacheUsage> usage = engine.KvUsage();
  return usage ? static_cast<uint32_t>(std::min<uint64_t>(blocks, usage->blocks)) : blocks;
}

struct Running {
  std::unique_ptr<v1::WorkerInfer> request;  // the stream's: it points into it
  std::unique_ptr<GenerationStream> stream;
  wp_sequence* sequence = nullptr;
  uint32_t mark = 0;
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  uint32_t cached_tokens = 0;  // of its prompt's, found in the engine's prefix cache
};

}  // namespace

void Serving::ServeGenerations(v1::WorkerInfer first, const std::shared_ptr<Engine>& engine) {
  const uint32_t model = first.model();
  // A generation sent to run alone (a retry after a worker's death) takes no company.
  const uint32_t capacity = first.batch() ? std::max(engine->info().sequences, 1u) : 1;
  std::vector<Running> running;

  // No room in its engine's KV cache beside the generations running (engine ABI version 12): nothing
  // ran, and the supervisor sends it again where there is room, keeping its place in the queue. Or
  // (preempted, version 13) its engine gave its room to the others after the chunks it sent: the
  // supervisor sends it again to go on after them.
  auto hand_back = [&](uint64_t job, const Status& why, uint64_t blocks, bool preempted = false) {
    v1::WorkerEnvelope reply;
    v1::WorkerInferDone* done = reply.mutable_infer_done();
    done->set_job(job);
    ipc::SetError(done->mutable_error(), why);
    done->set_kv_full(true);
    done->set_kv_blocks(blocks);
    done->set_kv_preempted(preempted);
    if (std::optional<Engine::KvCacheUsage> usage = engine->KvUsage()) WriteKvUsage(*usage, done->mutable_kv_usage());
    outbox_.Send(reply);
  };
  // Once one is handed back between two steps, those after it are too: none passes it here.
  bool handed_back = false;
  // Starts a generation: checked as any long job, opened in the engine, or answered with why not.
  auto join = [&](v1::WorkerInfer request) {
    const uint64_t job = request.job();
    EngineRequest args;  // holds the job's KV source from here: closed however the join ends
    args.kv_source = TakeKvSource(job);
    if (handed_back) {
      cancelled_.erase(job);
      return hand_back(job, Error(Code::kResourceExhausted, "behind a generation its KV cache had no room for"), 0);
    }
    const uint64_t oldest = running.empty() ? job : running.front().stream->job();
    Result<uint32_t> mark = BeginLongJob(request, engine, OkStatus(), oldest);
    if (!mark.ok()) return SendGenerateError(job, mark.status());
    Running r;
    r.request = std::make_unique<v1::WorkerInfer>(std::move(request));
    r.completion_tokens = static_cast<uint32_t>(r.request->resume_tokens_size());  // a resumed one's count on
    r.mark = *mark;
    r.stream = std::make_unique<GenerationStream>(*r.request, outbox_, outbox_.FaultsFor(job, r.request->faults()));
    r.stream->faults().Hit("infer.after_take");
    Status opened = ToEngineRequest(*r.request, args);
    if (opened.ok()) {
      Result<wp_sequence*> sequence = engine->OpenSequence(args.request, &r.prompt_tokens);
      if (sequence.ok()) r.sequence = *sequence;
      opened = sequence.status();
    }
    if (!opened.ok()) {
      marks_.Release(r.mark);
      cancelled_.erase(job);
      // Refused for want of room that the generations running hold (the engine says so): handed
      // back. Refused with none running, it can never be opened there: that is its answer, as is
      // any other error (an allocation that failed is not room that comes back).
      const uint64_t blocks = opened.code() == Code::kResourceExhausted ? engine->KvRefusedBlocks() : 0;
      if (blocks > 0 && !running.empty()) {
        handed_back = true;
        return hand_back(job, opened, blocks);
      }
      return SendGenerateError(job, opened);
    }
    running.push_back(std::move(r));
  };
  // Ends running[i]: its sequence closed, its mark released, its answer sent.
  auto end = [&](size_t i, Result<wp_generate_result> result, bool past_deadline) {
    Running& r = running[i];
    engine->CloseSequence(r.sequence);
    r.stream->SetKvUsage(engine->KvUsage());  // its blocks given back: what its answer says
    r.stream->faults().Hit("infer.before_restore");
    marks_.Release(r.mark);
    cancelled_.erase(r.stream->job());
    r.stream->Finish(std::move(result), past_deadline, r.cached_tokens);
    running.erase(running.begin() + static_cast<ptrdiff_t>(i));
  };
  // Preempted by its engine for room: closed here, handed back after the chunks it sent.
  auto preempt = [&](size_t i, const wp_sequence_step& step, uint32_t blocks) {
    Running& r = running[i];
    engine->CloseSequence(r.sequence);
    marks_.Release(r.mark);
    cancelled_.erase(r.stream->job());
    hand_back(r.stream->job(), StatusFromWp(step.status, step.error), blocks, /*preempted=*/true);
    running.erase(running.begin() + static_cast<ptrdiff_t>(i));
  };
  // Stopped from outside (its client, its deadline): what it made so far stands.
  auto stopped = [](const Running& r) {
    return wp_generate_result{WP_FINISH_CANCELLED, r.prompt_tokens, r.completion_tokens};
  };

  join(std::move(first));
  std::vector<wp_sequence_step> steps;
  while (!running.empty()) {
    steps.assign(running.size(), wp_sequence_step{});
    for (size_t i = 0; i < running.size(); ++i) steps[i].sequence = running[i].sequence;
    Status pass = engine->Step(steps, [&](uint32_t i, std::string_view text, std::span<const int32_t> tokens,
                                          std::span<const wp_token_logprobs> logprobs) {
      running[i].completion_tokens += static_cast<uint32_t>(tokens.size());
      running[i].stream->Emit(text, tokens, logprobs);
    });
    // The preempted first, oldest first: each goes back to wait in the order it came, and before any
    // that ended in the same step is answered (the supervisor keeps a generation handed back while
    // the replica runs others of its model). Generations sent here meanwhile do not take the room
    // they gave up: they go back too, behind them (as behind a refusal).
    bool preempted = false;
    for (size_t i = 0; pass.ok() && i < running.size();) {
      const uint32_t blocks = PreemptedBlocks(*engine, *running[i].request, steps[i]);
      if (blocks == 0) {
        ++i;
        continue;
      }
      preempt(i, steps[i], blocks);
      steps.erase(steps.begin() + static_cast<ptrdiff_t>(i));
      preempted = true;
    }
    for (size_t i = running.size(); i-- > 0;) {
      running[i].cached_tokens = steps[i].cached_tokens;
      if (!pass.ok()) {
        end(i, pass, false);
      } else if (steps[i].ended != 0) {
        end(i, steps[i].status == WP_OK ? Result<wp_generate_result>(steps[i].result)
                                        : StatusFromWp(steps[i].status, steps[i].error),
            false);
      }
    }
    // Between steps: what the supervisor sent meanwhile; who leaves; who joins.
    ReadWhileBusy();
    for (size_t i = running.size(); i-- > 0;) {
      const Running& r = running[i];
      const bool past_deadline = r.stream->PastDeadline();
      if (!read_error_.ok() || cancelled_.contains(r.stream->job()) || past_deadline) {
        end(i, stopped(r), past_deadline);
      } else {
        r.stream->HeartbeatIfDue();
      }
    }
    handed_back = preempted;
    while (read_error_.ok() && running.size() < capacity && !deferred_.empty()) {
      v1::WorkerEnvelope& front = deferred_.front().message;
      if (!front.has_infer() || !front.infer().has_generate() || front.infer().model() != model ||
          !front.infer().batch()) {
        break;  // not this batch's: it comes after (one to run alone, when the batch has ended)
      }
      v1::WorkerInfer request = std::move(*front.mutable_infer());
      deferred_.front().regions.Close();
      deferred_.pop_front();
      join(std::move(request));
    }
    // Those running say the cache as the step, their ended companions and those who joined left it
    // (an ended one said so in its answer: end()): what the joins spoke for is in the next chunks.
    const std::optional<Engine::KvCacheUsage> usage = engine->KvUsage();
    for (Running& r : running) r.stream->SetKvUsage(usage);
  }
}

}  // namespace warmpool::worker
