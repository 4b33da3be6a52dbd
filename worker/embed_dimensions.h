// An embedding made shorter (EmbedRequest.dimensions): its first values, scaled to unit length
// again, as OpenAI and Ollama give what their `dimensions` asks for. A model trained for it
// (Matryoshka representation learning) front-loads what matters, so the prefix is an embedding of
// its own; for another model it is a projection, which the caller asked for.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

namespace warmpool::worker {

// values[0 .. dimensions) scaled to unit length (sums of squares in double); a prefix whose
// squares sum to 0 stays as it is, and so does one holding a NaN or an infinity (what the model
// gave, not hidden by a division). dimensions <= values.size().
inline void ShortenEmbedding(std::span<float> values, uint32_t dimensions) {
  double squares = 0;
  for (uint32_t i = 0; i < dimensions; i++) squares += double{values[i]} * values[i];
  if (!(squares > 0) || !std::isfinite(squares)) return;
  // In double: the reciprocal of a norm of denormals is past float's range.
  const double norm = std::sqrt(squares);
  for (uint32_t i = 0; i < dimensions; i++) values[i] = static_cast<float>(values[i] / norm);
}

}  // namespace warmpool::worker
