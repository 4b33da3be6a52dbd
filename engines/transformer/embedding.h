// Embeddings from a decoder: the last token's hidden state after the final norm, L2-normalised
// (last-token pooling: how decoder embedding models such as Qwen3-Embedding and E5-Mistral are
// trained and read, and the state the output head reads in any decoder).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include <vector>

#include "common/status.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/kv_cache.h"
#include "engines/transformer/sequence.h"

namespace warmpool::transformer {

// tokens run from position 0 in pieces of kPrefillPiece (whatever the sequence's cache held is
// overwritten); out receives hidden_size floats. A run that is empty or longer than the context is
// INVALID_ARGUMENT. A state of all zeros stays zeros; NaN stays NaN. on_piece (unless null) is
// called after each piece but the last with the tokens run so far; returning false stops the
// embedding (UNAVAILABLE).
Status EmbedTokens(Sequence& sequence, std::span<const int32_t> tokens, std::span<float> out,
                   const std::function<bool(size_t done)>& on_piece = nullptr);

// Short inputs go together, in one step of the model (every projection reads each weight once for
// all of them, as a prompt's tokens do): a group is consecutive inputs of at most `rows` tokens
// each and in all (kPrefillPiece, or the context where it is shorter: what the engine's workspace
// counts activations for), at most kMaxEmbedGroup of them, whose caches take at most `blocks` KV
// blocks. Returns the end of the group that starts at `first` (first + 1 at least: a longer input
// goes alone, through EmbedTokens). The groups depend on the inputs and those numbers alone, so
// the same request on the same engine makes the same groups, and the same bits.
inline constexpr size_t kMaxEmbedGroup = 64;
size_t EmbedGroupEnd(std::span<const std::vector<int32_t>> inputs, size_t first, uint32_t blocks,
                     uint32_t rows = kPrefillPiece);
// The blocks `pool` can give: free, or keeping only a prefix nobody holds (a group may evict such
// prefixes from the prefix cache, as a long input does).
uint32_t AvailableBlocks(const KvPool& pool);
// A group's inputs (EmbedGroupEnd), each in a cache of its own from `pool` for the step and
// released after, into out (inputs x hidden_size, each as EmbedTokens makes it). Not the same bits
// as each alone: the step's products see more rows, and sum in another order.
Status EmbedGroup(CpuModel& model, KvPool& pool, uint32_t context, std::span<const std::vector<int32_t>> inputs,
                  std::span<float> out);

}  // namespace warmpool::transformer
