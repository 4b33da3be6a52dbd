// The transformer engine's generations (engine ABI versions 3 to 7): a request opened as a sequence
// in a free slot (its prompt rendered through the chat template and tokenized, its options checked),
// open sequences stepped together (engines/transformer/sequence_slots.h: continuous batching), and
// each step's text, tokens and log-probabilities handed to the caller as the ABI's chunks.
#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engines/builtin.h"
#include "engines/transformer/engine_state.h"
#include "engines/transformer/text_sequence.h"

// The ABI's opaque sequence: a generation and the slot its KV cache is.
struct wp_sequence {
  warmpool::transformer::TextSequence text;
  uint32_t slot = 0;
  uint32_t reserved = 0;  // blocks of the KV pool it may come to need (TransformerEngine::kv_reserved)
  // When its request arrived (the caller's order; 0: unknown) and when it opened: the latest to
  // arrive, then the youngest, is preempted first.
  uint64_t arrival = 0;
  uint64_t age = 0;
  bool preemptible = false;
  uint32_t preempted = 0;  // a step preempted it: the blocks it needs to go on
  bool failed = false;    // a step failed it: it takes no more steps
  bool reported = false;  // a step said it ended: it takes no more steps
};

namespace warmpool::transformer {
namespace {

// Stop strings a request may give, and their length: each is searched for in the text held back.
constexpr uint32_t kMaxStopStrings = 16;
constexpr uint64_t kMaxStopBytes = 256;

// A conversation as the prompt its model was trained on: its chat template, given the messages (and
// the tools it may call), the special tokens' text, and the assistant's turn to speak (Hugging
// Face's apply_chat_template). The messages come as roles and contents, or (version 6) as one JSON
// document that may hold tools and tool calls.
Result<std::string> RenderChat(const TransformerEngine& e, const wp_generate_request& r) {
  if (!e.files->chat) {
    return Error(Code::kFailedPrecondition,
                 "model \"{}\" has no chat template (tokenizer_config.json's chat_template): send a prompt", e.name);
  }
  nlohmann::ordered_json context = {{"messages", nlohmann::ordered_json::array()}};
  if (r.conversation.bytes != 0) {
    if (r.conversation.data == nullptr) return Error(Code::kInvalidArgument, "conversation missing");
    context = nlohmann::ordered_json::parse(r.conversation.data, r.conversation.data + r.conversation.bytes, nullptr, false);
    if (!context.is_object() || !context.contains("messages") || !context["messages"].is_array() ||
        (context.contains("tools") && !context["tools"].is_array())) {
      return Error(Code::kInvalidArgument, "the conversation is not {{\"messages\": [...], \"tools\": [...]}}");
    }
    if (context.contains("tools") && context["tools"].empty()) context.erase("tools");  // templates test `tools` as given
  } else {
    if (r.roles == nullptr || r.contents == nullptr) return Error(Code::kInvalidArgument, "messages missing");
    for (uint32_t i = 0; i < r.message_count; i++) {
      context["messages"].push_back(
          {{"role", std::string(r.roles[i].data != nullptr ? r.roles[i].data : "", r.roles[i].bytes)},
           {"content", std::string(r.contents[i].data != nullptr ? r.contents[i].data : "", r.contents[i].bytes)}});
    }
  }
  context["add_generation_prompt"] = true;
  context["bos_token"] = e.files->bos_text;
  context["eos_token"] = e.files->eos_text;
  const bool tools = context.contains("tools");
  return (tools && e.files->chat_tools ? e.files->chat_tools : e.files->chat)->Render(context);
}

// A chunk's log-probabilities in the ABI's terms, with each token's bytes: valid while it lives.
class ChunkLogprobs {
 public:
  ChunkLogprobs(const tokenizer::Tokenizer& tokenizer, std::span<const TokenLogprobs> logprobs) {
    auto piece = [&](int32_t id) -> const std::string& {
      Result<std::string> bytes = tokenizer.DecodePieces({&id, 1});
      return pieces_.emplace_back(bytes.ok() ? std::move(*bytes) : std::string());
    };
    for (const TokenLogprobs& l : logprobs) {
      std::vector<wp_logprob>& top = tops_.emplace_back();
      for (const auto& [id, logprob] : l.top) {
        const std::string& bytes = piece(id);
        top.push_back({id, logprob, {bytes.data(), bytes.size()}});
      }
      const std::string& bytes = piece(l.token);
      out_.push_back({{l.token, l.logprob, {bytes.data(), bytes.size()}}, top.data(), static_cast<uint32_t>(top.size())});
    }
  }
  const wp_token_logprobs* data() const { return out_.empty() ? nullptr : out_.data(); }

 private:
  std::deque<std::string> pieces_;             // a deque: what a wp_string points at never moves
  std::deque<std::vector<wp_logprob>> tops_;
  std::vector<wp_token_logprobs> out_;
};

// The ABI's request as the engine's: the prompt (text, token ids, or a chat rendered by the
// template), the options over the model's defaults, each checked.
Result<TextRequest> TextRequestFrom(const TransformerEngine& e, const wp_generate_request& r) {
  TextRequest request;
  if (r.message_count > 0 || r.conversation.bytes != 0) {
    Result<std::string> prompt = RenderChat(e, r);
    if (!prompt.ok()) return prompt.status();
    request.prompt = std::move(*prompt);
    request.add_special_tokens = false;  // HF's apply_chat_template: the template wrote them
  } else if (r.token_count > 0) {
    if (r.tokens == nullptr) return Error(Code::kInvalidArgument, "token ids missing");
    request.tokens.assign(r.tokens, r.tokens + r.token_count);
  } else {
    request.prompt.assign(r.prompt.data != nullptr ? r.prompt.data : "", r.prompt.bytes);
  }
  request.max_tokens = r.max_tokens;
  if (r.resume_count > 0) {
    if (r.resume_tokens == nullptr || r.resume_count > e.context) {
      return Error(Code::kInvalidArgument, "{} tokens to resume: at most the context's {}", r.resume_count, e.context);
    }
    request.resumed.assign(r.resume_tokens, r.resume_tokens + r.resume_count);
  }
  SamplingOptions& s = request.sampling;
  s = e.files->sampling;
  if (r.set & WP_SET_TEMPERATURE) s.temperature = r.temperature;
  if (r.set & WP_SET_TOP_K) s.top_k = r.top_k;
  if (r.set & WP_SET_TOP_P) s.top_p = r.top_p;
  if (r.set & WP_SET_MIN_P) s.min_p = r.min_p;
  if (r.set & WP_SET_REPETITION_PENALTY) s.repetition_penalty = r.repetition_penalty;
  if (r.set & WP_SET_SEED) s.seed = r.seed;
  if (Status checked = CheckSamplingOptions(s); !checked.ok()) return checked;
  if (r.stop_count > kMaxStopStrings) {
    return Error(Code::kInvalidArgument, "{} stop strings: at most {}", r.stop_count, kMaxStopStrings);
  }
  for (uint32_t i = 0; i < r.stop_count; i++) {
    if (r.stop[i].bytes > kMaxStopBytes) {
      return Error(Code::kInvalidArgument, "a stop string of {} bytes: at most {}", r.stop[i].bytes, kMaxStopBytes);
    }
    request.stop.emplace_back(r.stop[i].data != nullptr ? r.stop[i].data : "", r.stop[i].bytes);
  }
  request.logprobs = r.logprobs != 0;
  request.top_logprobs = r.top_logprobs;
  return request;
}

// What a preemptible sequence holds once its next step is done: its prompt's positions, and the one
// its first token goes to (none beyond what it can ever write).
uint32_t FirstBlocks(const TokenSequence& t) {
  return KvBlocksOf(std::min<uint64_t>(uint64_t{t.prefill_tokens()} + 1, t.most_positions()));
}
uint32_t BlocksAfterStep(const TokenSequence& t) {
  return std::max(FirstBlocks(t), KvBlocksOf(std::min<uint64_t>(uint64_t{t.position()} + 1, t.most_positions())));
}

// Before a step: each preemptible sequence's reservation grown to what it holds once the step is
// done (a decoding one writes one position; a prompt's pieces are covered from its opening). Where
// the pool cannot cover that beside the others', the preemptible sequences that arrived last give
// way, one at a time: each ends here (wp_sequence::preempted: what it needs to go on), its blocks
// freed for the step. Sequences admitted by all they may need never grow, so preempting every preemptible one
// always makes room: the rest were admitted within the pool.
void GrowReservations(TransformerEngine& e, wp_sequence_step* steps, uint32_t count) {
  if (!e.preempts || !e.kv_pool) return;
  std::vector<uint32_t> growing;  // steps' indices of preemptible sequences still running
  uint64_t more = 0;
  for (uint32_t i = 0; i < count; i++) {
    const wp_sequence& s = *steps[i].sequence;
    if (!s.preemptible || s.text.ended()) continue;
    growing.push_back(i);
    more += BlocksAfterStep(s.text.tokens()) - std::min(s.reserved, BlocksAfterStep(s.text.tokens()));
  }
  // The latest to arrive last (those of unknown arrival as if just arrived), so that the preempted
  // come off the back.
  auto order = [&](uint32_t i) {
    const wp_sequence& s = *steps[i].sequence;
    return std::pair(s.arrival != 0 ? s.arrival : UINT64_MAX, s.age);
  };
  std::sort(growing.begin(), growing.end(), [&](uint32_t a, uint32_t b) { return order(a) < order(b); });
  const uint32_t blocks = e.kv_pool->blocks().count();
  while (e.kv_reserved + more > blocks && !growing.empty()) {
    wp_sequence_step& step = steps[growing.back()];
    wp_sequence& s = *step.sequence;
    growing.pop_back();
    const TokenSequence& t = s.text.tokens();
    more -= BlocksAfterStep(t) - std::min(s.reserved, BlocksAfterStep(t));
    e.kv_reserved -= s.reserved;
    s.reserved = 0;
    e.slots->Free(s.slot);  // its blocks, for this step (its published prefix stays cached)
    s.reported = true;
    step.ended = 1;
    // Resumed after the tokens it emitted (every one but the last is in its cache), it opens with
    // the blocks of those and of one more position (FirstBlocks): that is what it needs to go on.
    s.preempted =
        std::max(FirstBlocks(t), KvBlocksOf(std::min<uint64_t>(uint64_t{t.position()} + 2, t.most_positions())));
    step.status = WpFromStatus(Error(Code::kResourceExhausted,
                                     "model \"{}\": preempted after {} positions to make room in its KV cache for "
                                     "other generations; it goes on once {} blocks are free",
                                     e.name, t.position(), s.preempted),
                               step.error, sizeof(step.error));
  }
  for (uint32_t i : growing) {
    wp_sequence& s = *steps[i].sequence;
    const uint32_t after = BlocksAfterStep(s.text.tokens());
    if (after > s.reserved) {
      e.kv_reserved += after - s.reserved;
      s.reserved = after;
    }
  }
}

void SetResult(const TextSequence& text, wp_generate_result& out) {
  static_assert(static_cast<int>(FinishReason::kStop) == WP_FINISH_STOP &&
                static_cast<int>(FinishReason::kLength) == WP_FINISH_LENGTH &&
                static_cast<int>(FinishReason::kCancelled) == WP_FINISH_CANCELLED);
  const TextResult r = text.result();
  out.finish_reason = static_cast<uint32_t>(r.finish);
  out.prompt_tokens = r.prompt_tokens;
  out.completion_tokens = r.completion_tokens;
}

}  // namespace

Result<wp_sequence*> OpenSequence(TransformerEngine& e, const wp_generate_request& r, uint32_t* prompt_tokens) {
  e.kv_refused = 0;  // says only this call's refusal for room (kv_reservations)
  if (!e.slots) return Error(Code::kFailedPrecondition, "model \"{}\" is not loaded", e.name);
  if (!e.has_head) return NoHead(e);
  auto free = std::find(e.slot_used.begin(), e.slot_used.end(), false);
  if (free == e.slot_used.end()) {
    return Error(Code::kResourceExhausted, "model \"{}\" runs {} generations at once, all in use", e.name,
                 e.sequences);
  }
  Result<TextRequest> request = TextRequestFrom(e, r);
  if (!request.ok()) return request.status();
  Result<TextSequence> text = TextSequence::Start(*e.files, *request, e.slots->context(), e.packed.config.vocab_size);
  if (!text.ok()) return text.status();
  // The blocks it may come to need, spoken for beside the open sequences': however the prefix cache
  // shares blocks and copies them, a step then never finds the pool empty (the blocks held never
  // exceed what the open sequences may need, and a shared block counts once). A pool smaller than
  // every sequence's whole context (kv_tokens) refuses the generation until one closes: the worker
  // hands it back to the supervisor, which sends it where there is room (engine ABI version 12).
  // Preemptible (engine ABI version 13, and only where the pool is shared: preempts): its prompt and
  // first token's blocks now, the rest as it grows (GrowReservations).
  const bool preemptible = e.preempts && r.preemptible != 0;
  const uint32_t need = !e.kv_pool     ? 0
                        : preemptible ? FirstBlocks(text->tokens())
                                      : KvBlocksOf(text->tokens().most_positions());
  if (e.kv_pool && e.kv_reserved + need > e.kv_pool->blocks().count()) {
    e.kv_refused = need;
    return Error(Code::kResourceExhausted,
                 "model \"{}\": its KV cache has {} of its {} blocks free of what the {} generations running may "
                 "need; this one may need {} ({} positions): it waits for one to end",
                 e.name, e.kv_pool->blocks().count() - e.kv_reserved, e.kv_pool->blocks().count(), e.open_sequences,
                 need, text->tokens().most_positions());
  }
  const auto slot = static_cast<uint32_t>(free - e.slot_used.begin());
  // The prompt's prefix that an earlier sequence left in the KV cache is not computed again, nor
  // what a dead worker's cache holds of the rest (a resumed stream: its prompt and tokens sent).
  // A source that is not this model's is no source: everything is computed, as ever.
  std::unique_ptr<OpenedKvSource> source;
  if (r.kv_source_bytes > 0 && r.kv_source >= 0) source = OpenKvSource(e, r.kv_source, r.kv_source_bytes);
  if (!text->ended()) {
    text->tokens().Skip(e.slots->Reuse(slot, text->tokens().prefill(), source ? &source->source() : nullptr));
  }
  auto* opened = new wp_sequence{std::move(*text), slot, need, r.arrival, ++e.opened, preemptible};
  *free = true;
  e.open_sequences++;
  e.kv_reserved += need;
  if (prompt_tokens != nullptr) *prompt_tokens = opened->text.tokens().prompt_tokens();
  return opened;
}

uint32_t PreemptedBlocks(const wp_sequence* sequence) { return sequence != nullptr ? sequence->preempted : 0; }

void CloseSequence(TransformerEngine& e, wp_sequence* sequence) {
  if (sequence == nullptr) return;
  e.slots->Free(sequence->slot);
  e.slot_used[sequence->slot] = false;
  e.open_sequences--;
  e.kv_reserved -= sequence->reserved;
  delete sequence;
}

Status StepSequences(TransformerEngine& e, wp_sequence_step* steps, uint32_t count, wp_step_emit_fn emit,
                     void* emit_ctx) {
  if (!e.slots) return Error(Code::kFailedPrecondition, "model \"{}\" is not loaded", e.name);
  if (count > 0 && steps == nullptr) return Error(Code::kInvalidArgument, "no sequences to step");
  std::vector<StepMember> members;
  for (uint32_t i = 0; i < count; i++) {
    const wp_sequence* s = steps[i].sequence;
    if (s == nullptr || s->failed || s->reported) {
      return Error(Code::kInvalidArgument, "sequence {} of the step is {}", i, s == nullptr ? "missing" : "over");
    }
    for (uint32_t j = 0; j < i; j++) {
      if (steps[j].sequence == s) return Error(Code::kInvalidArgument, "a sequence is in the step twice");
    }
  }
  std::vector<uint32_t> stepped;  // the step's index of each member
  for (uint32_t i = 0; i < count; i++) {
    steps[i].ended = 0;
    steps[i].status = WP_OK;
    steps[i].result = {};
    steps[i].error[0] = '\0';
  }
  GrowReservations(e, steps, count);
  for (uint32_t i = 0; i < count; i++) {
    wp_sequence& s = *steps[i].sequence;
    if (s.preempted != 0) continue;
    // Of the prompt's tokens: a resumed generation may find more, its own tokens after the prompt.
    steps[i].cached_tokens = std::min(s.text.tokens().cached_tokens(), s.text.tokens().prompt_tokens());
    if (s.text.ended()) {  // a resumed generation that was through already: it ends here, running nothing
      steps[i].ended = 1;
      s.reported = true;
      SetResult(s.text, steps[i].result);
      continue;
    }
    members.push_back({&s.text.tokens(), s.slot});
    stepped.push_back(i);
  }
  const AdvanceFn advance = [&](size_t member, uint32_t fed, std::span<const float> logits,
                                std::optional<int32_t> argmax) {
    const uint32_t i = stepped[member];
    wp_sequence_step& step = steps[i];
    wp_sequence& s = *step.sequence;
    Result<TextSequence::Output> out = s.text.Advance(fed, logits, argmax);
    if (!out.ok()) {  // this sequence's failure (a broken model's logits, say), not the others'
      s.failed = true;
      step.ended = 1;
      step.status = WpFromStatus(out.status(), step.error, sizeof(step.error));
      return;
    }
    if (out->token || !out->text.empty()) {
      std::span<const TokenLogprobs> logprobs;
      if (out->logprobs) logprobs = {&*out->logprobs, 1};
      ChunkLogprobs c_logprobs(*e.files->tokenizer, logprobs);
      wp_generate_chunk chunk{{out->text.data(), out->text.size()},
                              out->token ? &*out->token : nullptr,
                              out->token ? 1u : 0u,
                              c_logprobs.data(),
                              static_cast<uint32_t>(logprobs.size())};
      if (emit != nullptr) emit(emit_ctx, static_cast<uint32_t>(i), &chunk);
    }
    if (s.text.ended()) {
      step.ended = 1;
      s.reported = true;
      SetResult(s.text, step.result);
    }
  };
  return RunStep(*e.slots, members, advance, &e.pacer);
}

Status Generate(TransformerEngine& e, const wp_generate_request& request, wp_emit_fn emit, void* emit_ctx,
                wp_generate_result& result) {
  wp_generate_request r = request;
  r.preemptible = 0;  // nobody resumes a generate call: it runs to its end
  Result<wp_sequence*> opened = OpenSequence(e, r, nullptr);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<wp_sequence, std::function<void(wp_sequence*)>> sequence(
      *opened, [&e](wp_sequence* s) { CloseSequence(e, s); });
  struct Emitting {
    wp_emit_fn emit;
    void* ctx;
    bool stopped = false;
  } emitting{emit, emit_ctx};
  auto forward = [](void* ctx, uint32_t, const wp_generate_chunk* chunk) {
    auto* to = static_cast<Emitting*>(ctx);
    if (to->emit != nullptr && to->emit(to->ctx, chunk) != 0) to->stopped = true;
  };
  wp_sequence_step step{sequence.get(), 0, WP_OK, {}, {}, 0};
  const TokenSequence& tokens = sequence->text.tokens();
  while (step.ended == 0) {
    // Between a prompt's pieces: progress, nothing to send, and a point where it can be stopped.
    if (tokens.position() > 0 && tokens.position() < tokens.prefill_tokens()) {
      const wp_generate_chunk progress{};
      forward(&emitting, 0, &progress);
    }
    if (!emitting.stopped) {
      if (Status s = StepSequences(e, &step, 1, forward, &emitting); !s.ok()) return s;
      if (step.ended != 0 && step.status != WP_OK) return StatusFromWp(step.status, step.error);
    }
    if (emitting.stopped) {
      sequence->text.Cancel();
      SetResult(sequence->text, result);
      return OkStatus();
    }
  }
  result = step.result;
  return OkStatus();
}

}  // namespace warmpool::transformer
