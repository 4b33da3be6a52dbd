// The simulated file system: one versioned file per model. A file's header names the file and its
// version, so that an engine built from a header and a weights region can tell whether both came
// from the same version of the same file (the check "every answer from one consistent version").
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "supervisor/core/model_entry.h"

namespace warmpool::sim {

struct SimFile {
  uint32_t id = 0;
  std::string name;         // the model registered from it
  std::string path;         // "/sim/models/<name>.safetensors"; empty for an echo model
  uint32_t version = 1;
  uint64_t base_bytes = 0;  // weights grow a little with each version
  uint64_t workspace_bytes = 0;
  bool broken = false;      // garbage: every load fails
  bool echo = false;
  bool language = false;    // a language model: answers generate, refuses tensors (sim/generate.cc)
  uint64_t WeightBytes() const { return echo ? 0 : base_bytes + 4096ull * (version % 4); }
};

// A language model's context and KV cache per token, as its engine would report them.
inline constexpr uint32_t kSimContext = 64;
inline constexpr uint64_t kSimKvBytesPerToken = 64;
// Generations a language model's engine takes at once (the core sends it up to that many; it runs
// them one after another, admitting each by the KV blocks it may need: sim/kv_pages.cc).
inline constexpr uint32_t kSimSequences = 3;
// The words a worker refuses a generation with for want of KV room: never a client's answer (the
// core sends it again once there is room).
inline constexpr const char* kSimNoKvRoom = "no KV room";

// A generation's prompt is "token N", N the request's own number, which the simulated engines
// read, after a preamble that every third request has, one of three that others share as chats
// share a history (1 to 3 KiB: the core places a prompt by the KiBs it begins with; within the
// 4 KiB the core lets a context of kSimContext tokens take).
inline std::string SimPrompt(uint64_t token) {
  const std::string preamble = token % 3 == 0 ? std::string(1024 * (1 + token / 3 % 3), "abc"[token / 3 % 3]) : "";
  return preamble + "token " + std::to_string(token);
}
// N of a prompt (or an embedding's input, "token N").
inline uint64_t SimPromptNumber(const std::string& prompt) {
  const size_t at = prompt.rfind("token ");
  return at == std::string::npos ? 0 : std::strtoull(prompt.c_str() + at + 6, nullptr, 10);
}
// How often, per step, an engine preempts a generation the core said it may while another of the
// model's generations waits on the worker (engine ABI version 13): handed back mid-stream, it must
// go on after the tokens its client has, none twice and none missing.
inline constexpr uint32_t kPreemptPerMille = 40;

// What a header says.
struct Described {
  uint32_t file = 0;
  uint32_t version = 0;
  uint64_t weight_bytes = 0;
};

std::string HeaderOf(const SimFile& file);
std::optional<Described> ParseHeader(const std::string& header);
// What fstat(2) would say of this version of the file: another version has another size or times.
FileVersion VersionOf(const SimFile& file);
// The registry's view of the file now (what InspectModel would find).
supervisor::ModelEntry EntryOf(const SimFile& file);

// One line for the trace, without tensor payloads (printing those would cost more than the core).
std::string Brief(const v1::Envelope& message);
std::string Brief(const v1::WorkerEnvelope& message);

}  // namespace warmpool::sim
