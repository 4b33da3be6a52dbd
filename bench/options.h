// warmpool-bench's command line: every mode's options, with what each flag means to which mode.
// bench/main.cc picks the mode and hands it its own options (each mode in a file of its own:
// bench/latency.h without a mode flag, bench/generate.h for --generate, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace warmpool::bench {

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
  bool pieces = false;
  bool embeddings = false;
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

// Adds every flag and option to `app`, into `options`, and which modes exclude which.
void AddOptions(CLI::App& app, Options& options);

}  // namespace warmpool::bench
