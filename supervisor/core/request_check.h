// Every check a client request can fail on its own, before it touches any daemon state: the
// protocol version, a body the daemon understands, well-formed model names, an infer input that is
// a rows x cols f32 matrix, a generate request's prompt and stop strings, an embed request's inputs,
// a sane replica count and
// a known fault point and action. A pure function
// of the envelope, so that it can be unit-tested and fuzzed without a daemon.
//
// What it does not judge: who is asking (PERMISSION_DENIED comes first, from the peer's
// credentials), whether a well-formed model name is registered (NOT_FOUND comes later, from the
// index), whether fault injection is enabled, and anything else that depends on the daemon's state.
// A body this function does not know (added to the protocol later) passes; its handler judges it.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::supervisor {

// Replicas a load may ask for; the daemon further caps it to its worker count.
inline constexpr uint32_t kMaxRequestReplicas = 1024;

// A generate request's stop strings: how many, and how long each (the engine searches for each in
// the text it holds back).
inline constexpr int kMaxStopStrings = 16;
inline constexpr size_t kMaxStopBytes = 256;
// Messages of a conversation (their bytes count as the prompt's: core/generate.cc).
inline constexpr int kMaxMessages = 4096;
// Most likely tokens' log-probabilities a generation may ask for at each step.
inline constexpr uint32_t kMaxTopLogprobs = 20;
// Tools a generation may offer, and the size of each (a tool's JSON, a call's arguments), and how
// deeply their JSON may nest: parsed and written again further on, deeper would cost a stack frame
// a level.
inline constexpr int kMaxTools = 128;
inline constexpr size_t kMaxToolJsonBytes = 64u << 10;
inline constexpr int kMaxToolJsonDepth = 32;
// Inputs of one embed request.
inline constexpr int kMaxEmbedInputs = 256;
// The longest a token's text may be, in bytes, when the core bounds a prompt or an input by the
// model's context (core/generate.cc, core/embed.cc): a bound, not a tokenizer (Llama 3's longest
// tokens are runs of 16 to 32 spaces or dashes).
inline constexpr uint64_t kMaxBytesPerToken = 64;
// The bytes of an embed reply of `inputs` embeddings (an upper bound, for the frame limit).
uint64_t EmbedReplyBytes(int inputs, uint32_t embedding_size);

// OK, or INVALID_ARGUMENT / FAILED_PRECONDITION with a message that tells the client what to fix.
Status CheckRequest(const v1::Envelope& request);
// Requests only administrators may make: register, load, unload, pin, arm or clear faults.
bool IsAdminRequest(const v1::Envelope& request);

// An error reply envelope.
v1::Envelope ErrorReply(uint64_t request_id, const Status& status);

}  // namespace warmpool::supervisor
