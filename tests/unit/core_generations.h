// Generations as the core's tests send and answer them: a client's generate request, and a
// worker's chunks and final reply (core_generate_test.cc, core_parallel_test.cc).
#pragma once

#include <string>
#include <vector>

#include "tests/unit/core_rig.h"

namespace warmpool::supervisor::testing {

inline uint64_t Generate(CoreRig& rig, uint64_t session, const std::string& model, bool stream = true,
                  uint32_t deadline_ms = 0, bool tools = false) {
  v1::Envelope e;
  if (tools) {  // a chat with a tool
    e.mutable_generate()->add_tools(R"({"type": "function", "function": {"name": "lookup"}})");
    v1::ChatMessage* m = e.mutable_generate()->add_messages();
    m->set_role("user");
    m->set_content("look it up");
  }
  e.mutable_generate()->set_model(model);
  if (!tools) e.mutable_generate()->set_prompt("once upon a time");
  e.mutable_generate()->set_stream(stream);
  e.mutable_generate()->set_deadline_ms(deadline_ms);
  return rig.Request(session, std::move(e), /*admin=*/false);
}

inline v1::WorkerEnvelope Chunk(uint64_t job, const std::string& text, uint32_t index_the_worker_says = 99,
                         std::vector<int32_t> tokens = {}) {
  v1::WorkerEnvelope m;
  m.mutable_infer_chunk()->set_job(job);
  m.mutable_infer_chunk()->mutable_chunk()->set_index(index_the_worker_says);
  m.mutable_infer_chunk()->mutable_chunk()->set_text(text);
  m.mutable_infer_chunk()->mutable_chunk()->mutable_tokens()->Add(tokens.begin(), tokens.end());
  return m;
}

inline v1::WorkerEnvelope Done(uint64_t job, const std::string& finish = "length") {
  v1::WorkerEnvelope m;
  m.mutable_infer_done()->set_job(job);
  m.mutable_infer_done()->mutable_generate()->set_finish_reason(finish);
  m.mutable_infer_done()->mutable_generate()->set_completion_tokens(2);
  return m;
}

// What a worker says when its engine had no room for a generation (nothing of it ran), or preempted
// it for room (after the chunks it sent).
inline v1::WorkerEnvelope NoKvRoom(uint64_t job, uint64_t needed, uint64_t reserved, uint64_t blocks = 4,
                                   bool preempted = false) {
  v1::WorkerEnvelope m;
  v1::WorkerInferDone* done = m.mutable_infer_done();
  done->set_job(job);
  done->mutable_error()->set_code(v1::RESOURCE_EXHAUSTED);
  done->mutable_error()->set_message("no room in the KV cache");
  done->set_kv_full(true);
  done->set_kv_blocks(needed);
  done->set_kv_preempted(preempted);
  done->mutable_kv_usage()->set_blocks(blocks);
  done->mutable_kv_usage()->set_blocks_reserved(reserved);
  return m;
}

inline v1::WorkerEnvelope DoneSaying(uint64_t job, uint64_t reserved, uint64_t blocks = 4) {
  v1::WorkerEnvelope m = Done(job);
  m.mutable_infer_done()->mutable_kv_usage()->set_blocks(blocks);
  m.mutable_infer_done()->mutable_kv_usage()->set_blocks_reserved(reserved);
  return m;
}

}  // namespace warmpool::supervisor::testing
