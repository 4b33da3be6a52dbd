// Generations in the simulated world. A client asks a language model (file m2) — sometimes another
// model — to generate, streaming or not, with a deadline now and then; it may leave mid-stream.
// The worker streams a chunk per step (or a heartbeat, not streaming), checks between steps for a
// cancel and its deadline, and may crash or hang at any step; step i's token is i, and a
// generation resumed after its worker died goes on from the step after the tokens it is given.
// What the core emits is checked as it is emitted: a stream's chunks in order from 0, only to a
// client that asked for them, none after the final reply; and as the client reads it: every
// chunk's text from one consistent version of the model asked for, its token the next (no token
// twice, none missing, however many workers died under the stream), the final reply counting the
// chunks and tokens that came. Embeddings run the same way
// (a step per input, heartbeats only), each vector saying which weights made it. A generation's
// KV pages (its prompt's, then a position a step) come from its engine's pool (sim/kv_pages.cc),
// and the worker reports the pool's use with every chunk and end.
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "sim/simulator.h"

namespace warmpool::sim {
namespace {

// One step's text: the request's token (its prompt is "token N"), and which weights and which
// description made it.
template <typename Engine>
std::string StepText(const v1::GenerateRequest& g, const Engine& e) {
  return fmt::format("t{} f{} v{} d{} w{};", SimPromptNumber(g.prompt()), e.region.file, e.region.version, e.described.file,
                     e.described.version);
}

// An embedding as the simulated engine makes it: the same facts as a step's text, as five floats.
template <typename Engine>
void SimEmbedding(const std::string& input, const Engine& e, v1::Embedding* out) {
  for (uint64_t v : {uint64_t{std::strtoull(input.c_str() + 6, nullptr, 10)}, uint64_t{e.region.file},
                     uint64_t{e.region.version}, uint64_t{e.described.file}, uint64_t{e.described.version}}) {
    out->add_values(static_cast<float>(v));
  }
}

}  // namespace

void Simulator::ClientGenerates(Client& c) {
  v1::Envelope request;
  Pending p;
  if (rng_.Chance(250)) {  // embeddings instead
    p.kind = Pending::Kind::kEmbed;
    p.model = rng_.Chance(850) ? files_[2].name : PickModel();
    p.token = next_token_++;
    token_session_[p.token] = c.session;
    v1::EmbedRequest* e = request.mutable_embed();
    e->set_model(p.model);
    const int inputs = static_cast<int>(rng_.Range(1, 5));
    for (int i = 0; i < inputs; i++) e->add_input(fmt::format("token {}", p.token));
    if (rng_.Chance(200)) e->set_deadline_ms(static_cast<uint32_t>(rng_.Range(20, 400)));
    p.deadline_ms = e->deadline_ms();
    return SendRequest(c, std::move(request), p);
  }
  p.kind = Pending::Kind::kGenerate;
  p.model = rng_.Chance(850) ? files_[2].name : PickModel();
  p.stream = rng_.Chance(700);
  p.token = next_token_++;
  token_session_[p.token] = c.session;
  v1::GenerateRequest* g = request.mutable_generate();
  g->set_model(p.model);
  g->set_prompt(SimPrompt(p.token));  // whose request a worker runs
  g->set_max_tokens(static_cast<uint32_t>(rng_.Range(1, 24)));
  g->set_stream(p.stream);
  if (rng_.Chance(200)) g->set_deadline_ms(static_cast<uint32_t>(rng_.Range(20, 400)));
  p.deadline_ms = g->deadline_ms();
  if (rng_.Chance(50)) g->set_keep_alive_ms(static_cast<int64_t>(rng_.Range(0, 500)));
  SendRequest(c, std::move(request), p);
}

void Simulator::CheckChunkSent(Pending& p, const v1::Envelope& chunk) {
  if (p.replied) {
    return Fail(fmt::format("a chunk of request {} came after its final reply", chunk.request_id()));
  }
  if (p.kind != Pending::Kind::kGenerate || !p.stream) {
    return Fail(fmt::format("request {} got a chunk it did not ask for", chunk.request_id()));
  }
  if (chunk.generate_chunk().index() != p.chunks_sent) {
    return Fail(fmt::format("request {} got chunk {} after {} chunks", chunk.request_id(),
                            chunk.generate_chunk().index(), p.chunks_sent));
  }
  p.chunks_sent++;
}

void Simulator::CheckGenerateReply(Pending& p, const v1::Envelope& reply, bool final) {
  if (!final) {
    const v1::GenerateChunk& chunk = reply.generate_chunk();
    if (p.tail_seen) {
      return Fail(fmt::format("a stream of \"{}\" got a chunk after its tail of text alone: sent twice", p.model));
    }
    if (chunk.tokens_size() == 0) {
      p.tail_seen = true;  // an engine's held-back text at the end
    } else if (chunk.tokens_size() != 1 || chunk.tokens(0) != static_cast<int32_t>(p.tokens_seen)) {
      return Fail(fmt::format("a stream of \"{}\" got {} as its chunk {}: a token twice or one missing", p.model,
                              chunk.tokens_size() == 1 ? fmt::format("token {}", chunk.tokens(0)) : "several tokens",
                              p.chunks_seen));
    } else {
      p.tokens_seen++;
    }
    p.chunks_seen++;
    return CheckGeneratedText(p, chunk.text());
  }
  if (reply.has_error()) {
    if (reply.error().message().find("is not loaded in worker") != std::string::npos) {
      Fail(fmt::format("a generation of \"{}\" went to a worker that does not serve it: {}", p.model,
                       reply.error().message()));
    }
    if (reply.error().message().find(kSimNoKvRoom) != std::string::npos) {
      Fail(fmt::format("a generation of \"{}\" was answered with its worker's want of KV room, which others "
                       "running there were to give back: {}",
                       p.model, reply.error().message()));
    }
    return;
  }
  if (!reply.has_generate_reply()) {
    return Fail(fmt::format("a generation of \"{}\" got a reply of another kind", p.model));
  }
  const v1::GenerateReply& r = reply.generate_reply();
  if (r.chunks() != p.chunks_seen) {
    return Fail(fmt::format("a generation of \"{}\" says {} chunks; {} came", p.model, r.chunks(), p.chunks_seen));
  }
  if (p.stream && r.finish_reason() == "length" && r.completion_tokens() != p.tokens_seen) {
    return Fail(fmt::format("a stream of \"{}\" says {} tokens; {} came", p.model, r.completion_tokens(),
                            p.tokens_seen));
  }
  if (!p.stream) CheckGeneratedText(p, r.text());
  outcome_.replies_ok++;
}

void Simulator::CheckEmbedReply(const Pending& p, const v1::Envelope& reply) {
  if (reply.has_error()) {
    if (reply.error().message().find("is not loaded in worker") != std::string::npos) {
      Fail(fmt::format("embeddings of \"{}\" went to a worker that does not serve it: {}", p.model,
                       reply.error().message()));
    }
    return;
  }
  if (!reply.has_embed_reply()) return Fail(fmt::format("embeddings of \"{}\" got a reply of another kind", p.model));
  for (const v1::Embedding& e : reply.embed_reply().embeddings()) {
    if (e.values_size() != 5) return Fail(fmt::format("embeddings of \"{}\" came in a shape no engine made", p.model));
    CheckGeneratedText(p, fmt::format("t{} f{} v{} d{} w{};", e.values(0), e.values(1), e.values(2), e.values(3),
                                      e.values(4)));
  }
  outcome_.replies_ok++;
}

// Text as the simulated engine writes it: which weights and which description made each step.
void Simulator::CheckGeneratedText(const Pending& p, const std::string& text) {
  uint32_t file = 0;
  for (const SimFile& f : files_) {
    if (f.name == p.model) file = f.id;
  }
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find(';', at);
    unsigned token = 0, wf = 0, wv = 0, df = 0, dv = 0;
    if (end == std::string::npos ||
        std::sscanf(text.substr(at, end - at).c_str(), "t%u f%u v%u d%u w%u", &token, &wf, &wv, &df, &dv) != 5) {
      return Fail(fmt::format("a generation of \"{}\" produced text no engine wrote: \"{}\"", p.model, text));
    }
    if (token != p.token) {
      return Fail(fmt::format("request with token {} for \"{}\" got text of token {}", p.token, p.model, token));
    }
    if (wf != file || df != file || wv != dv || wv < p.min_version) {
      return Fail(fmt::format("\"{}\" (file {}, registered version {} when asked) generated from weights of file {} "
                              "version {} described as file {} version {}",
                              p.model, file, p.min_version, wf, wv, df, dv));
    }
    at = end + 1;
  }
}

void Simulator::StartGeneration(Worker& w, uint64_t job, WorkerJob work) {
  w.serving_job = job;
  const uint32_t slot = w.slot, generation = w.generation;
  // Resumed: on from the step after the tokens its client has (step i's token is i).
  const v1::WorkerInfer& infer = work.message.infer();
  for (int i = 0; i < infer.resume_tokens_size(); i++) {
    if (infer.resume_tokens(i) != i) {
      return Fail(fmt::format("generation {} resumed after token {} as its token {}", job, infer.resume_tokens(i), i));
    }
  }
  const auto first = static_cast<uint32_t>(infer.resume_tokens_size());
  // Its KV source: keys and values of these very weights (a reload's would be of others).
  auto engine = w.engines.find(infer.model());
  if (infer.kv_source() && engine != w.engines.end()) {
    const Region* cache = work.region >= 0 ? &regions_[work.region] : nullptr;
    if (cache == nullptr || !cache->kv_cache || cache->file != engine->second.region.file ||
        cache->version != engine->second.region.version) {
      return Fail(fmt::format("generation {} on worker {} was handed a KV cache of file {} version {}; its engine "
                              "serves file {} version {}",
                              job, slot, cache ? cache->file : 0, cache ? cache->version : 0,
                              engine->second.region.file, engine->second.region.version));
    }
  }
  if (engine != w.engines.end()) OpenKvSequence(engine->second, job, infer);
  After(rng_.Range(0, 5), [this, slot, generation, job, first, work = std::move(work)]() mutable {
    GenerationStep(slot, generation, job, first, std::move(work));
  });
}

// An engine preempts a generation the core said it may (WorkerInfer.preemptible) when others want
// its blocks: here, now and then, while another of the model's generations waits on this worker.
bool Simulator::PreemptsFor(const Worker& w, const v1::WorkerInfer& infer, uint32_t step) {
  if (!infer.preemptible() || !infer.batch() || step == 0) return false;
  const bool others = std::any_of(w.serving.begin(), w.serving.end(), [&](const WorkerJob& work) {
    return work.message.has_infer() && work.message.infer().has_generate() &&
           work.message.infer().model() == infer.model();
  });
  return others && rng_.Chance(kPreemptPerMille);
}

void Simulator::GenerationStep(uint32_t slot, uint32_t generation, uint64_t job, uint32_t step, WorkerJob work) {
  Worker& w = workers_[slot];
  if (w.generation != generation || w.state != Worker::State::kUp || w.serving_job != job) return;
  if (rng_.Chance(crash_per_mille_)) return Kill(slot, "");  // mid-stream, its marker taken
  if (rng_.Chance(hang_per_mille_)) {
    Trace(fmt::format("== worker {} hangs in generation {}", slot, job));
    return;  // no step again: the core's stall check must kill it
  }
  const v1::WorkerInfer& in = work.message.infer();
  const v1::GenerateRequest& g = in.generate();
  const bool embed = in.has_embed();  // a step per input, heartbeats only, vectors at the end
  const uint32_t steps = embed ? static_cast<uint32_t>(in.embed().input_size()) : std::max(1u, g.max_tokens());
  auto engine = w.engines.find(in.model());
  const bool past_deadline =
      in.deadline_unix_ms() != 0 && Now().unix_ns / 1000000 > static_cast<uint64_t>(in.deadline_unix_ms());
  const bool cancelled = w.cancelled.count(job) != 0;
  if (engine == w.engines.end() || !engine->second.weights || past_deadline || cancelled || step >= steps) {
    v1::WorkerEnvelope reply;
    v1::WorkerInferDone* done = reply.mutable_infer_done();
    done->set_job(job);
    if (engine == w.engines.end()) {
      done->mutable_error()->set_code(v1::UNAVAILABLE);
      done->mutable_error()->set_message(fmt::format("model {} is not loaded in worker {}", in.model(), slot));
    } else if (!engine->second.weights) {
      done->mutable_error()->set_code(v1::FAILED_PRECONDITION);
      done->mutable_error()->set_message("not a language model");
    } else if (embed && (cancelled || past_deadline)) {
      done->mutable_error()->set_code(cancelled ? v1::UNAVAILABLE : v1::DEADLINE_EXCEEDED);
      done->mutable_error()->set_message("the embeddings were stopped");
    } else if (embed) {
      v1::EmbedReply* r = done->mutable_embed();
      r->set_dimensions(5);
      for (const std::string& input : in.embed().input()) SimEmbedding(input, engine->second, r->add_embeddings());
    } else {
      if (g.stream() && !cancelled && !past_deadline && step % 3 == 0) {
        // Now and then a tail of text alone before the end, as an engine sends what it held back:
        // a worker dying after it must not have it sent again.
        v1::WorkerEnvelope tail;
        tail.mutable_infer_chunk()->set_job(job);
        tail.mutable_infer_chunk()->mutable_chunk()->set_text(StepText(g, engine->second));
        ReplyToCore(w, std::move(tail));
        if (rng_.Chance(crash_per_mille_ * 20)) return Kill(slot, "");  // after the tail, before the end
      }
      v1::GenerateReply* r = done->mutable_generate();
      r->set_finish_reason(cancelled || past_deadline ? "cancelled" : "length");
      r->set_completion_tokens(step);
      // Without chunks, the reply holds every step's text.
      for (uint32_t i = 0; !g.stream() && i < step; i++) r->mutable_text()->append(StepText(g, engine->second));
    }
    if (engine != w.engines.end()) {
      CloseKvSequence(engine->second, job);
      ReportKvUsage(engine->second, done->mutable_kv_usage());
    }
    w.cancelled.erase(job);
    w.serving_job = 0;
    ReplyToCore(w, std::move(reply));
    return StartServing(w);
  }
  if (!embed && PreemptsFor(w, in, step)) {
    // Preempted for room (engine ABI version 13): its blocks given back, nothing of this step sent,
    // handed back to go on after the chunks sent, as the engine's step and the worker do it.
    v1::WorkerEnvelope reply;
    v1::WorkerInferDone* done = reply.mutable_infer_done();
    done->set_job(job);
    done->mutable_error()->set_code(v1::RESOURCE_EXHAUSTED);
    done->mutable_error()->set_message(fmt::format("{}: preempted after {} steps", kSimNoKvRoom, step));
    done->set_kv_full(true);
    done->set_kv_blocks(KvBlocksToGoOn(engine->second, job));
    done->set_kv_preempted(true);
    CloseKvSequence(engine->second, job);
    ReportKvUsage(engine->second, done->mutable_kv_usage());
    w.cancelled.erase(job);
    w.serving_job = 0;
    outcome_.kv_waits++;
    outcome_.preemptions++;
    ReplyToCore(w, std::move(reply));
    return StartServing(w);
  }
  v1::WorkerEnvelope message;
  message.mutable_infer_chunk()->set_job(job);
  if (!embed && g.stream()) {  // a chunk; else a heartbeat: the step, no text
    v1::GenerateChunk* chunk = message.mutable_infer_chunk()->mutable_chunk();
    chunk->set_index(step);
    chunk->add_tokens(static_cast<int32_t>(step));
    chunk->set_text(StepText(g, engine->second));
  }
  StepKvSequence(engine->second, job, step);
  ReportKvUsage(engine->second, message.mutable_infer_chunk()->mutable_kv_usage());
  ReplyToCore(w, std::move(message));
  uint64_t pause = rng_.Range(0, 8);
  if (rng_.Chance(slow_per_mille_)) pause *= 20;
  After(pause, [this, slot, generation, job, step, work = std::move(work)]() mutable {
    GenerationStep(slot, generation, job, step + 1, std::move(work));
  });
}

}  // namespace warmpool::sim
