// The streams bench's model (bench/language_model.h) in this process, for the benches that time
// the CPU engine's pieces directly: a random checkpoint of about model_mib MiB of bf16 weights and
// a 32000-token vocabulary, written to a directory removed with it, bound, and a CpuModel over it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "engines/transformer/checkpoint.h"
#include "engines/transformer/config.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/weights.h"

namespace warmpool::bench {

struct InProcessModel {
  std::string dir;
  std::unique_ptr<transformer::Checkpoint> checkpoint;
  transformer::ModelWeights weights;
  transformer::Config config;  // its KV element as the engine chooses it on this CPU
  std::unique_ptr<transformer::CpuModel> cpu;
  ~InProcessModel();
};

// positions: the checkpoint's max_position_embeddings.
Status OpenInProcessModel(uint32_t model_mib, uint32_t positions, uint32_t threads, InProcessModel& model);

}  // namespace warmpool::bench
