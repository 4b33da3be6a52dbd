// What a GPU model refuses of a step before anything runs (GpuModel::Step's INVALID_ARGUMENT): more
// runs or rows than its plan's, a run past the context or its table, a block outside the pool, a
// token outside the vocabulary, outputs with no room. Header-only: the GPU module checks with it,
// and host code and tests can too, without the module.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "engines/transformer/gpu_sequence.h"

namespace warmpool::transformer {

inline Status CheckGpuStep(const Config& config, const GpuPlan& plan, uint32_t context,
                           std::span<const int32_t> tokens, std::span<const GpuRun> runs, std::span<float> out,
                           std::span<int32_t> argmax) {
  if (runs.empty() || runs.size() > plan.sequences) {
    return Error(Code::kInvalidArgument, "a step of {} runs (1 to {})", runs.size(), plan.sequences);
  }
  if (tokens.size() > plan.rows) {
    return Error(Code::kInvalidArgument, "a step of {} rows (at most {})", tokens.size(), plan.rows);
  }
  uint64_t rows = 0;
  bool hidden = false, logits = false, choose = false;
  for (const GpuRun& run : runs) {
    rows += run.rows;
    hidden = hidden || run.want == GpuRun::Want::kHidden;
    logits = logits || run.want == GpuRun::Want::kLogits;
    choose = choose || run.want == GpuRun::Want::kArgMax;
    const uint64_t end = uint64_t{run.start} + run.rows;
    if (run.rows == 0 || end > context) {
      return Error(Code::kInvalidArgument, "positions {} to {} are past the context of {} tokens", run.start,
                   end - 1, context);
    }
    if (run.table.size() < KvBlocksOf(end) || run.table.size() > plan.table_blocks) {
      return Error(Code::kInvalidArgument, "a table of {} blocks for positions up to {}", run.table.size(), end);
    }
    for (uint32_t block : run.table) {
      if (block >= plan.blocks) {
        return Error(Code::kInvalidArgument, "block {} of a pool of {}", block, plan.blocks);
      }
    }
  }
  if (rows != tokens.size()) {
    return Error(Code::kInvalidArgument, "{} tokens for runs of {} rows", tokens.size(), rows);
  }
  for (int32_t token : tokens) {
    if (token < 0 || static_cast<uint32_t>(token) >= config.vocab_size) {
      return Error(Code::kInvalidArgument, "token {} is outside the vocabulary of {}", token, config.vocab_size);
    }
  }
  if (hidden && (logits || choose)) {
    return Error(Code::kInvalidArgument, "a step gives hidden states or logits, not both");
  }
  const uint64_t width = hidden ? config.hidden_size : config.vocab_size;
  if ((hidden || logits) && out.size() < runs.size() * width) {
    return Error(Code::kInvalidArgument, "{} floats of output for {} runs of {}", out.size(), runs.size(), width);
  }
  if (choose && argmax.size() < runs.size()) {
    return Error(Code::kInvalidArgument, "{} argmax entries for {} runs", argmax.size(), runs.size());
  }
  return OkStatus();
}

}  // namespace warmpool::transformer
