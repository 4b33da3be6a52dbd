// KV pages in the simulated world: each language engine of a simulated worker keeps the transformer
// engine's own pool and caches (engines/transformer/kv_cache.h), of a shape of one float per
// position, and its generations use them as the engine's do: a generation's cache takes the
// longest published prefix of its prompt, computes the rest, grows a position a step, and releases
// its blocks when the generation ends however it ends (done, cancelled, past its deadline); the
// pool goes with its engine (unload, worker killed). Prompts come in five families of up to four
// blocks, more than the pool's five blocks hold, so that published prefixes are found, kept after
// their generation and evicted; a prompt often ends near a block's end, so that generated tokens
// fill blocks too. A simulated worker runs one generation at a time, so no block is held twice
// here (sharing and copy-on-write are kv_cache_test's). The worker reports the pool's use with
// every chunk and end, as the engine's kv_usage does.
//
// The core sends a worker up to kSimSequences generations of a model at once, and the worker admits
// each as it arrives by the blocks it may come to need (its prompt and max_tokens), as the engine
// does when it opens one: one that would take the pool past its blocks while others are there is
// sent back (kv_full), and the core must send it again once there is room, ahead of those behind
// it. Each reservation lasts until its generation ends, and is checked to.
//
// After every event, for every engine: each block in exactly one state and the prefix index the
// published blocks (KvBlocks::Consistent); each block held exactly as many times as the caches
// name it (held = referenced: none freed while a sequence names it, none counted twice); and no
// cache but the running generation's (a generation that ended without releasing its blocks would
// hold them for ever).
#include <algorithm>

#include <fmt/format.h>

#include "sim/simulator.h"

namespace warmpool::sim {
namespace {

using transformer::KvCache;
using transformer::KvPool;
using transformer::kKvBlockTokens;

// The pool's positions per sequence: several blocks, whatever kSimContext (the core's figure) says.
constexpr uint32_t kKvContext = 5 * kKvBlockTokens;
// A generated token: apart from the prompts' (0, 1, 2, ...).
constexpr int32_t kFirstGeneratedToken = 100000;

transformer::Config PageShape() {
  transformer::Config c;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 1;
  c.num_key_value_heads = 1;
  c.head_dim = 1;
  return c;
}

// The prompt "token N" as tokens: family N % 5's (1000 x family, and on), 0 to 3 whole blocks and
// then 1 to 60 tokens more (near a block's end at times, so that a generation's tokens fill it).
std::vector<int32_t> PromptTokens(const std::string& prompt) {
  const uint64_t n = SimPromptNumber(prompt);
  std::vector<int32_t> tokens(kKvBlockTokens * (n / 5 % 4) + 1 + (n * 7) % 60);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = static_cast<int32_t>(1000 * (n % 5) + i);
  return tokens;
}

}  // namespace

std::shared_ptr<Simulator::KvPages> Simulator::NewKvPages() {
  auto pages = std::make_shared<KvPages>();
  Result<std::unique_ptr<KvPool>> pool = KvPool::Make(PageShape(), transformer::KvPoolBlocks(kKvContext, 1));
  if (!pool.ok()) {
    Fail("a simulated KV pool could not be made: " + pool.status().ToString());
    return nullptr;
  }
  pages->pool = std::move(*pool);
  return pages;
}

bool Simulator::AdmitKvSequence(Worker& w, const WorkerJob& work) {
  if (!work.message.has_infer() || !work.message.infer().has_generate()) return true;
  const v1::WorkerInfer& infer = work.message.infer();
  auto engine = w.engines.find(infer.model());
  if (engine == w.engines.end() || engine->second.kv == nullptr) return true;
  KvPages& pages = *engine->second.kv;
  // Its prompt and every token it may generate but the last, up to the context (TokenSequence::
  // most_positions).
  const uint64_t positions = PromptTokens(infer.generate().prompt()).size() + std::max(infer.generate().max_tokens(), 1u) - 1;
  const uint32_t need = transformer::KvBlocksOf(std::min<uint64_t>(positions, kKvContext));
  // One to run alone (a retry after a crash) runs once the others have ended: never refused.
  if (pages.reserved_blocks + need > pages.pool->blocks().count() && !pages.reserved.empty() && infer.batch()) {
    v1::WorkerEnvelope reply;
    v1::WorkerInferDone* done = reply.mutable_infer_done();
    done->set_job(infer.job());
    done->mutable_error()->set_code(v1::RESOURCE_EXHAUSTED);
    done->mutable_error()->set_message(fmt::format("{}: {} blocks wanted, {} of {} spoken for", kSimNoKvRoom, need,
                                                   pages.reserved_blocks, pages.pool->blocks().count()));
    done->set_kv_full(true);
    done->set_kv_blocks(need);
    ReportKvUsage(engine->second, done->mutable_kv_usage());
    ReplyToCore(w, std::move(reply));
    outcome_.kv_waits++;
    return false;
  }
  pages.reserved[infer.job()] = need;
  pages.reserved_blocks += need;
  return true;
}

void Simulator::OpenKvSequence(Engine& e, uint64_t job, const v1::WorkerInfer& infer) {
  if (e.kv == nullptr || !infer.has_generate()) return;
  std::vector<int32_t> tokens = PromptTokens(infer.generate().prompt());
  for (int i = 0; i < infer.resume_tokens_size(); i++) tokens.push_back(kFirstGeneratedToken + infer.resume_tokens(i));
  auto cache = std::make_unique<KvCache>(*e.kv->pool, kKvContext);
  // As the engine opens a sequence: whole published blocks of the prompt, never its last token.
  const uint32_t cached = cache->Reuse(tokens, static_cast<uint32_t>(tokens.size() - 1));
  const auto end = static_cast<uint32_t>(std::min<size_t>(tokens.size(), kKvContext));
  if (cached < end) {
    if (Status s = cache->Prepare(cached, end); !s.ok()) {
      return Fail(
          fmt::format("generation {}: a pool of one sequence's blocks refused its prompt: {}", job, s.message()));
    }
    cache->Commit(cached, std::span<const int32_t>(tokens).subspan(cached, end - cached));
  }
  e.kv->sequences[job] = std::move(cache);
}

void Simulator::StepKvSequence(Engine& e, uint64_t job, uint32_t step) {
  if (e.kv == nullptr) return;
  auto it = e.kv->sequences.find(job);
  if (it == e.kv->sequences.end()) return;  // opened in an engine since replaced
  KvCache& cache = *it->second;
  const uint32_t at = cache.length();
  if (at >= cache.context()) return;
  if (Status s = cache.Prepare(at, at + 1); !s.ok()) {
    return Fail(fmt::format("generation {}: a pool of one sequence's blocks refused its step: {}", job, s.message()));
  }
  const int32_t token = kFirstGeneratedToken + static_cast<int32_t>(step);
  cache.Commit(at, {&token, 1});
}

uint32_t Simulator::KvBlocksToGoOn(const Engine& e, uint64_t job) const {
  if (e.kv == nullptr) return 1;
  auto it = e.kv->sequences.find(job);
  return it == e.kv->sequences.end() ? 1 : std::max(1u, transformer::KvBlocksOf(uint64_t{it->second->length()} + 1));
}

void Simulator::CloseKvSequence(Engine& e, uint64_t job) {
  if (e.kv == nullptr) return;
  e.kv->sequences.erase(job);
  if (auto it = e.kv->reserved.find(job); it != e.kv->reserved.end()) {
    e.kv->reserved_blocks -= it->second;
    e.kv->reserved.erase(it);
  }
}

void Simulator::ReportKvUsage(const Engine& e, v1::KvUsage* usage) {
  if (e.kv == nullptr) return;
  const transformer::KvBlocks& blocks = e.kv->pool->blocks();
  usage->set_blocks_held(blocks.counts().held);
  usage->set_blocks(blocks.count());
  usage->set_blocks_reserved(e.kv->reserved_blocks);
}

void Simulator::CheckKvPages() {
  for (const Worker& w : workers_) {
    if (w.state != Worker::State::kUp) continue;  // a dead process's engines are gone with it
    for (const auto& [model, e] : w.engines) {
      if (e.kv == nullptr) continue;
      const transformer::KvBlocks& blocks = e.kv->pool->blocks();
      if (!blocks.Consistent()) {
        return Fail(fmt::format("worker {} model {}: the KV pool's states or prefix index are inconsistent", w.slot,
                                model));
      }
      // Every reservation is a generation's the worker still has (running or waiting its turn):
      // one that outlived its generation would shrink the room for good.
      for (const auto& [job, need] : e.kv->reserved) {
        const bool waiting = std::any_of(w.serving.begin(), w.serving.end(), [job = job](const WorkerJob& work) {
          return work.message.has_infer() && work.message.infer().job() == job;
        });
        if (job != w.serving_job && !waiting) {
          return Fail(fmt::format("worker {} model {}: generation {} keeps {} KV blocks reserved after its end", w.slot,
                                  model, job, need));
        }
      }
      std::vector<uint32_t> named(blocks.count(), 0);
      for (const auto& [job, cache] : e.kv->sequences) {
        if (job != w.serving_job) {
          return Fail(fmt::format("worker {} model {}: generation {} holds KV blocks after its end (running: {})",
                                  w.slot, model, job, w.serving_job));
        }
        for (uint32_t block : cache->blocks()) named[block]++;
      }
      for (uint32_t b = 0; b < blocks.count(); b++) {
        if (blocks.holders(b) != named[b]) {
          return Fail(fmt::format("worker {} model {}: KV block {} is held {} times and named by {} caches", w.slot,
                                  model, b, blocks.holders(b), named[b]));
        }
      }
    }
  }
}

}  // namespace warmpool::sim
