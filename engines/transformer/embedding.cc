#include "engines/transformer/embedding.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "engines/transformer/generation.h"

namespace warmpool::transformer {
namespace {

// In double: the reciprocal of a norm of denormals is past float's range. A state of zeros stays
// zeros; one holding NaN stays NaN.
void ToUnitLength(std::span<float> values) {
  double squares = 0;
  for (float v : values) squares += double{v} * v;
  if (!(squares > 0)) return;
  const double norm = std::sqrt(squares);
  for (float& v : values) v = static_cast<float>(v / norm);
}

}  // namespace

Status EmbedTokens(Sequence& sequence, std::span<const int32_t> tokens, std::span<float> out,
                   const std::function<bool(size_t done)>& on_piece) {
  const uint32_t hidden = sequence.config().hidden_size;
  if (tokens.empty()) return Error(Code::kInvalidArgument, "an input with no tokens");
  if (tokens.size() > sequence.context()) {
    return Error(Code::kInvalidArgument, "an input of {} tokens does not fit the context of {}", tokens.size(),
                 sequence.context());
  }
  if (out.size() < hidden) {
    return Error(Code::kInvalidArgument, "{} floats for an embedding of {}", out.size(), hidden);
  }
  // The earlier pieces only fill the cache: their last states (not logits, which a model without
  // an output head has none of, and which cost a product with the head) go to scratch.
  std::vector<float> scratch(hidden);
  size_t done = 0;
  for (; tokens.size() - done > kPrefillPiece; done += kPrefillPiece) {
    if (Status s = sequence.Hidden(tokens.subspan(done, kPrefillPiece), static_cast<uint32_t>(done), scratch); !s.ok()) {
      return s;
    }
    if (on_piece && !on_piece(done + kPrefillPiece)) return Error(Code::kUnavailable, "the embedding was stopped");
  }
  if (Status s = sequence.Hidden(tokens.subspan(done), static_cast<uint32_t>(done), out); !s.ok()) return s;
  ToUnitLength(out.first(hidden));
  return OkStatus();
}

size_t EmbedGroupEnd(std::span<const std::vector<int32_t>> inputs, size_t first, uint32_t blocks, uint32_t rows_cap) {
  size_t end = first, rows = 0;
  uint32_t taken = 0;
  while (end < inputs.size() && end - first < kMaxEmbedGroup) {
    const size_t n = inputs[end].size();
    const auto needs = static_cast<uint32_t>((n + kKvBlockTokens - 1) / kKvBlockTokens);
    if (n == 0 || rows + n > rows_cap || taken + needs > blocks) break;
    rows += n;
    taken += needs;
    ++end;
  }
  return std::max(end, first + 1);
}

uint32_t AvailableBlocks(const KvPool& pool) {
  const KvBlocks::Counts counts = pool.blocks().counts();
  return counts.free + counts.cached;
}

Status EmbedGroup(CpuModel& model, KvPool& pool, uint32_t context, std::span<const std::vector<int32_t>> inputs,
                  std::span<float> out) {
  const uint32_t hidden = model.config().hidden_size;
  if (out.size() < inputs.size() * uint64_t{hidden}) {
    return Error(Code::kInvalidArgument, "{} floats for {} embeddings of {}", out.size(), inputs.size(), hidden);
  }
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<StepRun> runs;
  std::vector<int32_t> tokens;
  for (const std::vector<int32_t>& input : inputs) {
    if (input.empty()) return Error(Code::kInvalidArgument, "an input with no tokens");
    caches.push_back(std::make_unique<KvCache>(pool, context));
    runs.push_back(StepRun{caches.back().get(), 0, static_cast<uint32_t>(input.size())});
    tokens.insert(tokens.end(), input.begin(), input.end());
  }
  if (Status s = model.StepHidden(tokens, runs, out); !s.ok()) return s;
  for (size_t i = 0; i < inputs.size(); ++i) ToUnitLength(out.subspan(i * hidden, hidden));
  return OkStatus();
}

}  // namespace warmpool::transformer
