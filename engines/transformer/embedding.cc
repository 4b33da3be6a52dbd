#include "engines/transformer/embedding.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engines/transformer/generation.h"

namespace warmpool::transformer {

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
  double squares = 0;
  for (uint32_t i = 0; i < hidden; i++) squares += double{out[i]} * out[i];
  if (squares > 0) {
    // In double: the reciprocal of a norm of denormals is past float's range.
    const double norm = std::sqrt(squares);
    for (uint32_t i = 0; i < hidden; i++) out[i] = static_cast<float>(out[i] / norm);
  }
  return OkStatus();
}

}  // namespace warmpool::transformer
