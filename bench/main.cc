// warmpool-bench: the mode each flag runs, handed its own options (bench/options.h has them all; each
// mode is in a file of its own: bench/latency.h without a mode flag, bench/generate.h for
// --generate, ...). Every mode is a report: it prints numbers and ratios against its goals and
// asserts nothing.
#include <algorithm>
#include <cstdint>

#include "bench/abuse.h"
#include "bench/batching.h"
#include "bench/decode_attention.h"
#include "bench/embed_cost.h"
#include "bench/piece_cost.h"
#include "bench/compute.h"
#include "bench/generate.h"
#include "bench/http_generate.h"
#include "bench/latency.h"
#include "bench/options.h"
#include "bench/parked_generate.h"
#include "bench/recovery.h"
#include "bench/regions.h"
#include "bench/restart.h"
#include "bench/sharing.h"
#include "bench/resume_generate.h"
#include "bench/second_turn.h"
#include "bench/stream_generate.h"
#include "bench/switch.h"
#include "common/command_line.h"

int main(int argc, char** argv) {
  warmpool::bench::Options options;
  CLI::App app{
      "warmpool-bench: round-trip latency of `infer` on the echo model through a private warmpoold, "
      "compared in the same run with a raw two-hop Unix-socket relay carrying identical frames "
      "(client -> relay -> echo server -> relay -> client). Prints p50/p99/mean latency, "
      "throughput and the warmpool/relay ratios; asserts nothing."};
  warmpool::bench::AddOptions(app, options);
  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (options.regions) {
    warmpool::bench::RegionsOptions regions;
    regions.daemon = options.daemon;
    regions.backend = options.backend;
    if (app.get_option("--payload-mib")->count() > 0) regions.payload_mib = options.payload_mib;
    if (app.get_option("--iterations")->count() > 0) regions.iterations = options.iterations;
    regions.json = options.json;
    return warmpool::bench::RunRegions(regions);
  }
  if (options.batching) {
    warmpool::bench::BatchingOptions batching;
    batching.daemon = options.daemon;
    batching.backend = options.backend;
    if (app.get_option("--layers")->count() > 0) batching.layers = options.layers;
    if (app.get_option("--clients")->count() > 0) batching.clients = options.clients;
    if (app.get_option("--requests")->count() > 0) batching.requests = options.requests;
    if (app.get_option("--rounds")->count() > 0) batching.rounds = options.rounds;
    batching.delay_us = options.delay_us;
    batching.json = options.json;
    return warmpool::bench::RunBatching(batching);
  }
  if (options.generate && options.resume) {
    warmpool::bench::ResumeGenerateOptions resume;
    resume.daemon = options.daemon;
    resume.tokenizer_dir = options.tokenizer_dir;
    resume.backend = options.backend;
    if (app.get_option("--model-mib")->count() > 0) resume.model_mib = static_cast<uint32_t>(options.model_mib);
    if (app.get_option("--prompt")->count() > 0) resume.prompt = options.prompt;
    if (app.get_option("--tokens")->count() > 0) resume.tokens = options.tokens;
    if (app.get_option("--rounds")->count() > 0) resume.rounds = options.rounds;
    resume.json = options.json;
    return warmpool::bench::RunResumeGenerate(resume);
  }
  if (options.generate && options.pieces) {
    warmpool::bench::PieceCostOptions pieces;
    if (app.get_option("--model-mib")->count() > 0) pieces.model_mib = static_cast<uint32_t>(options.model_mib);
    if (app.get_option("--prompt")->count() > 0) pieces.position = options.prompt;
    if (app.get_option("--rounds")->count() > 0) pieces.rounds = options.rounds;
    if (app.get_option("--threads")->count() > 0) pieces.threads = std::max(1u, options.threads);
    pieces.json = options.json;
    return warmpool::bench::RunPieceCost(pieces);
  }
  if (options.generate && options.embeddings) {
    warmpool::bench::EmbedCostOptions embed;
    if (app.get_option("--model-mib")->count() > 0) embed.model_mib = static_cast<uint32_t>(options.model_mib);
    if (app.get_option("--batch")->count() > 0) embed.inputs = options.batch;
    if (app.get_option("--tokens")->count() > 0) embed.tokens = options.tokens;
    if (app.get_option("--rounds")->count() > 0) embed.rounds = options.rounds;
    if (app.get_option("--threads")->count() > 0) embed.threads = std::max(1u, options.threads);
    embed.json = options.json;
    return warmpool::bench::RunEmbedCost(embed);
  }
  if (options.generate && options.attention) {
    warmpool::bench::DecodeAttentionOptions attention;
    attention.sequences = std::max(1u, options.batch);
    if (app.get_option("--prompt")->count() > 0) attention.positions = options.prompt;
    if (app.get_option("--rounds")->count() > 0) attention.rounds = options.rounds;
    attention.threads = std::max(1u, options.threads);
    attention.json = options.json;
    return warmpool::bench::RunDecodeAttention(attention);
  }
  if (options.generate && options.second_turn) {
    warmpool::bench::SecondTurnOptions turns;
    turns.daemon = options.daemon;
    turns.tokenizer_dir = options.tokenizer_dir;
    turns.backend = options.backend;
    turns.history = options.long_prompt;
    turns.replicas = std::max(1u, options.replicas);
    if (app.get_option("--model-mib")->count() > 0) turns.model_mib = static_cast<uint32_t>(options.model_mib);
    if (app.get_option("--tokens")->count() > 0) turns.tokens = options.tokens;
    if (app.get_option("--rounds")->count() > 0) turns.rounds = options.rounds;
    turns.json = options.json;
    return warmpool::bench::RunSecondTurn(turns);
  }
  if (options.generate && options.streams > 0) {
    warmpool::bench::StreamGenerateOptions streams;
    streams.daemon = options.daemon;
    streams.tokenizer_dir = options.tokenizer_dir;
    streams.backend = options.backend;
    streams.streams = options.streams;
    streams.long_prompt = options.long_prompt;
    streams.kv_cache_tokens = options.kv_cache_tokens;
    streams.prefill_stretch = options.prefill_stretch;
    if (app.get_option("--threads")->count() > 0) streams.threads = static_cast<uint32_t>(options.threads);
    if (app.get_option("--model-mib")->count() > 0) streams.model_mib = static_cast<uint32_t>(options.model_mib);
    if (app.get_option("--prompt")->count() > 0) streams.prompt = options.prompt;
    if (app.get_option("--tokens")->count() > 0) streams.tokens = options.tokens;
    if (app.get_option("--rounds")->count() > 0) streams.rounds = options.rounds;
    streams.json = options.json;
    return warmpool::bench::RunStreamGenerate(streams);
  }
  if (options.generate && options.http) {
    warmpool::bench::HttpGenerateOptions http;
    http.daemon = options.daemon;
    http.tokenizer_dir = options.tokenizer_dir;
    if (app.get_option("--model-mib")->count() > 0) http.model_mib = static_cast<uint32_t>(options.model_mib);
    if (app.get_option("--prompt")->count() > 0) http.prompt = options.prompt;
    if (app.get_option("--tokens")->count() > 0) http.tokens = options.tokens;
    if (app.get_option("--rounds")->count() > 0) http.rounds = options.rounds;
    http.json = options.json;
    return warmpool::bench::RunHttpGenerate(http);
  }
  if (options.generate && options.parked) {
    warmpool::bench::ParkedGenerateOptions parked;
    parked.daemon = options.daemon;
    parked.tokenizer_dir = options.tokenizer_dir;
    if (app.get_option("--model-mib")->count() > 0) parked.model_mib = static_cast<uint32_t>(options.model_mib);
    parked.prompt = options.prompt;
    if (app.get_option("--rounds")->count() > 0) parked.rounds = options.rounds;
    parked.json = options.json;
    return warmpool::bench::RunParkedGenerate(parked);
  }
  if (options.generate) {
    warmpool::bench::GenerateOptions generate;
    if (app.get_option("--model-mib")->count() > 0) generate.model_mib = options.model_mib;
    generate.dtype = options.dtype;
    generate.kv_cache = options.kv_cache;
    generate.threads = options.threads;
    generate.batch = options.batch;
    generate.prompt = options.prompt;
    generate.tokens = options.tokens;
    if (app.get_option("--rounds")->count() > 0) generate.rounds = options.rounds;
    generate.json = options.json;
    generate.torch_python = options.torch_python;
    return warmpool::bench::RunGenerate(generate);
  }
  if (options.compute) {
    warmpool::bench::ComputeOptions compute;
    compute.layers = options.layers;
    compute.batches = options.batches;
    compute.rounds = options.rounds;
    compute.threads = options.threads;
    compute.torch_python = options.torch_python;
    compute.json = options.json;
    return warmpool::bench::RunCompute(compute);
  }
  if (options.abuse) {
    warmpool::bench::AbuseOptions abuse;
    abuse.daemon = options.daemon;
    abuse.backend = options.backend;
    abuse.greedy = options.greedy;
    abuse.payload_mib = options.payload_mib;
    abuse.seconds = options.seconds;
    abuse.json = options.json;
    return warmpool::bench::RunAbuse(abuse);
  }
  if (options.sharing) {
    warmpool::bench::SharingOptions sharing;
    sharing.daemon = options.daemon;
    sharing.backend = options.backend;
    if (app.get_option("--iterations")->count() > 0) sharing.iterations = options.iterations;
    sharing.sizes_mib = options.sizes_mib;
    sharing.poll_us = options.poll_us;
    sharing.features = options.features;
    sharing.json = options.json;
    return warmpool::bench::RunSharing(sharing);
  }
  if (options.switch_models) {
    warmpool::bench::SwitchOptions switch_options;
    switch_options.daemon = options.daemon;
    switch_options.backend = options.backend;
    if (app.get_option("--iterations")->count() > 0) switch_options.iterations = options.iterations;
    if (app.get_option("--model-mib")->count() > 0) switch_options.model_mib = options.model_mib;
    switch_options.json = options.json;
    return warmpool::bench::RunSwitch(switch_options);
  }
  if (options.restart) {
    warmpool::bench::RestartOptions restart;
    restart.daemon = options.daemon;
    restart.backend = options.backend;
    if (app.get_option("--iterations")->count() > 0) restart.iterations = options.iterations;
    if (app.get_option("--model-mib")->count() > 0) restart.model_mib = options.model_mib;
    restart.json = options.json;
    return warmpool::bench::RunRestart(restart);
  }
  if (options.recovery) {
    warmpool::bench::RecoveryOptions recovery;
    recovery.daemon = options.daemon;
    recovery.backend = options.backend;
    recovery.iterations = options.iterations;
    recovery.model_mib = options.model_mib;
    recovery.inflight = options.inflight;
    recovery.rows = options.rows;
    recovery.replicas = options.replicas;
    recovery.json = options.json;
    return warmpool::bench::RunRecovery(recovery);
  }
  warmpool::bench::LatencyOptions latency;
  latency.daemon = options.daemon;
  latency.backend = options.backend;
  latency.requests = options.requests;
  latency.warmup = options.warmup;
  latency.payload = options.payload;
  latency.clients = options.clients;
  latency.pipeline = options.pipeline;
  latency.rounds = options.rounds;
  latency.json = options.json;
  return warmpool::bench::RunLatency(latency);
}
