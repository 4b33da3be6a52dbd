// Embeddings from a decoder: the last token's hidden state after the final norm, L2-normalised
// (last-token pooling: how decoder embedding models such as Qwen3-Embedding and E5-Mistral are
// trained and read, and the state the output head reads in any decoder).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "common/status.h"
#include "engines/transformer/sequence.h"

namespace warmpool::transformer {

// tokens run from position 0 in pieces of kPrefillPiece (whatever the sequence's cache held is
// overwritten); out receives hidden_size floats. A run that is empty or longer than the context is
// INVALID_ARGUMENT. A state of all zeros stays zeros; NaN stays NaN. on_piece (unless null) is
// called after each piece but the last with the tokens run so far; returning false stops the
// embedding (UNAVAILABLE).
Status EmbedTokens(Sequence& sequence, std::span<const int32_t> tokens, std::span<float> out,
                   const std::function<bool(size_t done)>& on_piece = nullptr);

}  // namespace warmpool::transformer
