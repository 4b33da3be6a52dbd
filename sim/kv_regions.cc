// The simulated workers' KV cache regions (sim/workers.cc runs their jobs): the region a language
// engine's load shares with the supervisor (a memfd, or in odd seeds device memory as a GPU's pool
// is), the host copy of a device one that a park asks for, and what the core hands back (a dead
// replica's cache to a retried generation, a parked one to the engine that unparks the model),
// each checked against what the core may hand.
#include <fmt/format.h>

#include "sim/simulator.h"

namespace warmpool::sim {

bool Simulator::CheckKvSource(uint32_t slot, const v1::WorkerEnvelope& message, const std::vector<int>& handles) {
  // A retried generation takes the KV cache of a replica of its model whose worker died.
  auto cache = handles.empty() ? regions_.end() : regions_.find(handles.back());
  if (cache == regions_.end() || !cache->second.kv_cache || !message.infer().has_generate()) {
    Fail(fmt::format("worker {} was sent a KV source that is no replica's cache ({})", slot, Brief(message)));
    return false;
  }
  if (message.infer().kv_source_bytes() != cache->second.bytes) {
    Fail(fmt::format("worker {} was sent a KV source of {} bytes said to be {}", slot, cache->second.bytes,
                     message.infer().kv_source_bytes()));
    return false;
  }
  const Worker& writer = workers_[cache->second.slot];
  if (writer.generation == cache->second.generation && writer.state == Worker::State::kUp) {
    Fail(fmt::format("worker {} was sent the KV cache of worker {}, which is alive and may write it", slot,
                     cache->second.slot));
    return false;
  }
  return true;
}

bool Simulator::ShareCache(const Worker& w, const Region& weights, v1::WorkerLoadDone& done, std::vector<int>& out) {
  Region cache = weights;
  cache.bytes = weights.bytes / 4 + 1;  // what parking it with its copy costs the park budget
  // In odd seeds the language model keeps its cache in device memory, as a GPU's pool does: held by
  // its grant, lost with its device's owner, parked only as the host copy a park asks for. In even
  // ones, the engine's own memfd.
  const bool on_device = !weights.host && options_.seed % 2 == 1;
  cache.host = !on_device;
  cache.device = weights.device;
  cache.kv_cache = true;
  cache.slot = w.slot;
  cache.generation = w.generation;
  done.set_cache_shared(true);
  done.set_cache_bytes(cache.bytes);
  done.set_cache_grant(on_device ? 1 : 0);
  out.push_back(NewSupervisorHandle(cache));
  outcome_.device_caches += on_device;
  return on_device;
}

void Simulator::CheckParkedCache(const Worker& w, const v1::WorkerAttach& a, const Region& weights, int cache) {
  // A parked model's KV cache goes to the engine that unparks it: a cache its engine left when it
  // closed (none is up with the model now: it is parked), of these very weights.
  const Region* kept = cache >= 0 ? &regions_[cache] : nullptr;
  if (!a.copy() || kept == nullptr || !kept->kv_cache) {
    return Fail(fmt::format("worker {} was sent a KV cache to adopt that is no parked cache ({})", w.slot,
                            a.copy() ? "not a cache" : "with an attach that is no unpark"));
  }
  if (!kept->host) {
    return Fail(fmt::format("worker {} was sent a parked KV cache in device memory, which parking was to free",
                            w.slot));
  }
  if (kept->file != weights.file || kept->version != weights.version) {
    return Fail(fmt::format("worker {} unparks file {} version {} with the KV cache of file {} version {}", w.slot,
                            weights.file, weights.version, kept->file, kept->version));
  }
  const Worker& writer = workers_[kept->slot];
  if (writer.generation == kept->generation && writer.state == Worker::State::kUp &&
      writer.engines.contains(a.model())) {
    Fail(fmt::format("worker {} was sent the KV cache of worker {}, whose engine of \"{}\" is open and may write it",
                     w.slot, kept->slot, a.name()));
  }
}

void Simulator::CopyCacheToPark(const Worker& w, const Engine& e, uint32_t model, v1::WorkerParkDone& done,
                                std::vector<int>& out) {
  // A copy of its GPU pool, sealed in host memory: asked for only where the cache is device memory.
  if (!e.kv_on_device) {
    return Fail(fmt::format("worker {} was asked to copy out the KV cache of model {}, which is host memory already",
                            w.slot, model));
  }
  Region copy = e.region;
  copy.host = true;
  copy.bytes = copy.bytes / 4 + 1;
  copy.kv_cache = true;
  copy.slot = w.slot;
  copy.generation = w.generation;
  done.set_cache_copy(true);
  done.set_cache_copy_bytes(copy.bytes);
  outcome_.pool_copies++;
  out.push_back(NewSupervisorHandle(copy));
}

}  // namespace warmpool::sim
