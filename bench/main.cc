// warmpool-bench's command line: every mode's options, and the mode each flag runs (each mode in a
// file of its own: bench/latency.h without a mode flag, bench/generate.h for --generate, ...).
// Every mode is a report: it prints numbers and ratios against its goals and asserts nothing.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/abuse.h"
#include "bench/batching.h"
#include "bench/decode_attention.h"
#include "bench/compute.h"
#include "bench/generate.h"
#include "bench/http_generate.h"
#include "bench/latency.h"
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

namespace warmpool::bench {
namespace {

struct Options {
  std::string daemon;
  std::string backend = "host";
  uint64_t requests = 20000;
  uint64_t warmup = 2000;
  uint64_t payload = 1024;
  uint32_t clients = 1;
  uint32_t pipeline = 1;  // requests in flight per client
  uint32_t rounds = 4;
  bool json = false;
  // --restart
  bool restart = false;
  // --switch
  bool switch_models = false;
  // --recovery
  bool recovery = false;
  uint32_t iterations = 20;
  uint64_t model_mib = 16;
  uint32_t inflight = 8;
  uint32_t replicas = 1;
  uint32_t rows = 64;
  // --abuse
  bool abuse = false;
  uint32_t greedy = 4;
  uint32_t payload_mib = 4;
  uint32_t seconds = 5;
  // --sharing
  bool sharing = false;
  std::vector<uint64_t> sizes_mib = {16, 1024};
  uint32_t poll_us = 50;
  uint32_t features = 0;
  // --batching
  bool batching = false;
  uint32_t delay_us = 500;
  // --regions
  bool regions = false;
  // --generate
  bool generate = false;
  bool parked = false;
  bool http = false;
  bool second_turn = false;
  bool attention = false;
  bool resume = false;
  std::string dtype = "bf16";
  std::string kv_cache = "auto";
  uint32_t prompt = 128;
  uint32_t tokens = 32;
  uint32_t batch = 8;
  uint32_t streams = 0;
  uint64_t kv_cache_tokens = 0;
  double prefill_stretch = 0;
  uint32_t long_prompt = 2048;
  std::string tokenizer_dir = "demo/license-llama";
  // --compute
  bool compute = false;
  std::vector<uint32_t> layers = {4096, 16384, 4096};
  std::vector<uint32_t> batches = {1, 256};
  uint32_t threads = 1;
  std::string torch_python = "/usr/bin/python3";
};

}  // namespace
}  // namespace warmpool::bench

int main(int argc, char** argv) {
  warmpool::bench::Options options;
  CLI::App app{
      "warmpool-bench: round-trip latency of `infer` on the echo model through a private warmpoold, "
      "compared in the same run with a raw two-hop Unix-socket relay carrying identical frames "
      "(client -> relay -> echo server -> relay -> client). Prints p50/p99/mean latency, "
      "throughput and the warmpool/relay ratios; asserts nothing."};
  app.add_option("--daemon", options.daemon,
                 "warmpoold binary (default: warmpoold next to warmpool-bench)");
  app.add_option("--requests", options.requests,
                 "measured requests per path, in total over all clients")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "warm-up requests per path, not measured")
      ->capture_default_str();
  app.add_option("--payload", options.payload,
                 "input tensor bytes (f32, 1 row, payload/4 columns)")
      ->capture_default_str();
  app.add_option("--clients", options.clients,
                 "concurrent closed-loop clients, one thread and one connection each")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--pipeline", options.pipeline,
                 "requests each client keeps in flight (1: one at a time); both paths alike")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--rounds", options.rounds,
                 "measured rounds, alternating relay and warmpool (ABBA)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--backend", options.backend, "warmpoold --backend: host, cuda or auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "host", "cuda"}));
  app.add_flag("--json", options.json, "print one JSON object instead of the table");
  app.add_flag("--recovery", options.recovery,
               "instead: recovery after SIGKILL of a busy worker serving a dense model, against a "
               "warm load from the page cache (see bench/recovery.h)");
  app.add_flag("--sharing", options.sharing,
               "instead: supervisor-held weights: cold load vs cat, replica attach time, PSS of "
               "4 replicas and unpark vs memcpy, per model size (see bench/sharing.h)");
  app.add_option("--sizes-mib", options.sizes_mib, "--sharing: model sizes, MiB of f32 weights")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--poll-us", options.poll_us,
                 "--sharing: sleep between two ps polls while waiting for a replica")
      ->capture_default_str();
  app.add_option("--features", options.features,
                 "--sharing: input and output width of the generated MLPs (0: square, in = out ~ "
                 "hidden; the per-replica workspace grows with the hidden width)")
      ->capture_default_str();
  CLI::Option* iterations =
      app.add_option("--iterations", options.iterations,
                     "--recovery: kills (and baseline loads); --sharing: cat + load pairs, attach "
                     "sequences and unparks per size (default 10 there)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
  app.add_option("--model-mib", options.model_mib, "--recovery, --restart, --switch: MiB of f32 weights in each model; --generate: MiB of weights")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--inflight", options.inflight,
                 "--recovery: requests pipelined on the worker when it is killed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rows", options.rows, "--recovery: rows of each of those requests")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--replicas", options.replicas,
                 "--recovery: replicas of the model (1 or 2); --second-turn: replicas, with another stream "
                 "running beside the second turn")
      ->capture_default_str()
      ->check(CLI::Range(1, 2));
  app.add_flag("--abuse", options.abuse,
               "instead: the daemon's memory under clients that pipeline large inputs and never "
               "read their replies, with the default limits and with them raised (see "
               "bench/abuse.h)");
  app.add_option("--greedy", options.greedy, "--abuse: greedy clients")->capture_default_str();
  app.add_option("--payload-mib", options.payload_mib, "--abuse: MiB of each greedy request; --regions: MiB per request (16)")
      ->capture_default_str();
  app.add_option("--seconds", options.seconds, "--abuse: how long the greedy clients push")
      ->capture_default_str();
  app.add_flag("--compute", options.compute,
               "instead: the dense engine's arithmetic in-process, f32/f16/bf16 weights, against "
               "OpenBLAS on the f32 weights as numpy calls it (see bench/compute.h)");
  app.add_option("--layers", options.layers, "--compute: layer widths, in,hidden...,out")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batches", options.batches, "--compute: rows per call, one measurement each")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", options.threads, "--compute, --generate: threads of the engine (and OpenBLAS and PyTorch)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--torch-python", options.torch_python,
                 "--compute, --generate: Python with PyTorch for the baseline (empty: none; without "
                 "PyTorch it is left out, saying why)")
      ->capture_default_str();
  app.add_flag("--generate", options.generate,
               "the transformer engine on the CPU, in-process: decode tokens/s against the read bandwidth "
               "measured in the same run, and prefill (see bench/generate.h)");
  app.add_option("--dtype", options.dtype, "--generate: f32, f16 or bf16 weights")->capture_default_str();
  app.add_option("--kv-cache", options.kv_cache,
                 "--generate in-process: the KV cache's element, auto (the engine's choice: bf16 for bf16 weights "
                 "where the CPU has AVX-512 BF16), f32 or bf16")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
  app.add_flag("--parked", options.parked,
               "--generate: through a daemon, a parked model's time to first token against unpark + prefill "
               "(bench/parked_generate.h; run from the repository root: it takes the demo model's tokenizer)");
  app.add_flag("--http", options.http,
               "--generate: through a daemon, tokens/s and time to first token of a stream through the "
               "OpenAI-compatible SSE endpoint against the framed protocol (bench/http_generate.h; run from "
               "the repository root)");
  app.add_option("--streams", options.streams,
                 "--generate: through a daemon, this many greedy streams at once against one alone, and a "
                 "stream's inter-token latency beside a --long-prompt prefill (continuous batching; "
                 "bench/stream_generate.h; run from the repository root)");
  app.add_option("--kv-cache-tokens", options.kv_cache_tokens,
                 "--generate --streams: [[models]] kv_cache_tokens, the positions the model's KV cache holds "
                 "for all its streams (0: a whole context each)")
      ->capture_default_str();
  app.add_option("--prefill-stretch", options.prefill_stretch,
                 "--generate --streams: [[models]] prefill_stretch, the decode steps a step carrying a prompt's "
                 "piece beside the streams may take (0: the engine's default, 2)")
      ->capture_default_str();
  app.add_flag("--resume", options.resume,
               "--generate: through a daemon, a stream whose worker is SIGKILLed halfway: the gap to its next "
               "token against its median (bench/resume_generate.h; run from the repository root)");
  app.add_flag("--attention", options.attention,
               "--generate: decode attention alone, in-process: --batch sequences' rows over --prompt positions "
               "each, every layer of the --streams model, against reading the same keys and values "
               "(bench/decode_attention.h)");
  app.add_flag("--second-turn", options.second_turn,
               "--generate: through a daemon, a chat's second turn's time to first token against its first's "
               "after a --long-prompt history (the prefix cache; bench/second_turn.h; run from the repository root)");
  app.add_option("--tokenizer-dir", options.tokenizer_dir,
                 "--generate through a daemon: the model directory whose tokenizer.json and tokenizer_config.json the "
                 "bench's model takes")
      ->capture_default_str();
  app.add_option("--long-prompt", options.long_prompt,
                 "--generate --streams: the prompt prefilled beside a stream; --second-turn: the history")
      ->capture_default_str();
  app.add_option("--prompt", options.prompt, "--generate: prefill tokens")->capture_default_str();
  app.add_option("--tokens", options.tokens, "--generate: decode steps")->capture_default_str();
  app.add_option("--batch", options.batch,
                 "--generate: also step this many sequences together (continuous batching), against batch 1 "
                 "(0 or 1: not measured)")
      ->capture_default_str();
  app.add_flag("--batching", options.batching,
               "instead: dynamic batching: --clients clients x 1 row on a dense model, batched against "
               "batching off and against the engine in-process on as many rows per call (see "
               "bench/batching.h; --clients defaults to 16 there, --requests is per round)");
  app.add_option("--delay-us", options.delay_us, "--batching: [pool] max_batch_delay_us of the batched model")
      ->capture_default_str();
  app.add_flag("--regions", options.regions,
               "instead: large tensors through a client's shared-memory region: a --payload-mib "
               "(default 16) echo round trip against copying the bytes in and out once (memcpy), "
               "with the request alone and through frames beside it (see bench/regions.h)");
  app.add_flag("--restart", options.restart,
               "instead: a restart of warmpoold with a warm --model-mib model (default 1024): from the new "
               "daemon's start to the model ready and to its first inference, with the descriptor store "
               "(weights kept) and without it (a load from the page cache) (see bench/restart.h)");
  app.add_flag("--switch", options.switch_models,
               "instead: two --model-mib models (default 512) under a budget of one, requested in turn: "
               "each request evicts the other and loads its own, against `cat` of the file (see "
               "bench/switch.h)");
  app.get_option("--switch")->excludes("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse")->excludes("--batching")->excludes("--regions")->excludes("--restart");
  app.get_option("--restart")->excludes("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse")->excludes("--batching")->excludes("--regions");
  app.get_option("--regions")->excludes("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse")->excludes("--batching");
  app.get_option("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse");
  app.get_option("--generate")->excludes("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse")->excludes("--batching")->excludes("--regions")->excludes("--restart")->excludes("--switch");
  app.get_option("--batching")->excludes("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse");
  app.get_option("--recovery")->excludes("--sharing");
  app.get_option("--abuse")->excludes("--sharing")->excludes("--recovery");
  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (options.regions) {
    warmpool::bench::RegionsOptions regions;
    regions.daemon = options.daemon;
    regions.backend = options.backend;
    if (app.get_option("--payload-mib")->count() > 0) regions.payload_mib = options.payload_mib;
    if (iterations->count() > 0) regions.iterations = options.iterations;
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
    if (iterations->count() > 0) sharing.iterations = options.iterations;
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
    if (iterations->count() > 0) switch_options.iterations = options.iterations;
    if (app.get_option("--model-mib")->count() > 0) switch_options.model_mib = options.model_mib;
    switch_options.json = options.json;
    return warmpool::bench::RunSwitch(switch_options);
  }
  if (options.restart) {
    warmpool::bench::RestartOptions restart;
    restart.daemon = options.daemon;
    restart.backend = options.backend;
    if (iterations->count() > 0) restart.iterations = options.iterations;
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
