// A Hugging Face model directory's small files, as a user may hand them over: config.json,
// tokenizer_config.json and generation_config.json (with a fixed, valid tokenizer.json).
//
// Input: the three files' texts, separated by NUL bytes (missing ones are absent files).
//
// Checked: config.json is refused with INVALID_ARGUMENT and a valid UTF-8 message, or gives a
// config whose widths stay within what the forward pass sizes buffers by, whose rotary
// frequencies are head_dim / 2 finite positive numbers, and whose KV cache and workspace at the
// whole context and the most sequences do not wrap around 64 bits. The serving files are refused
// the same way, or give end tokens and a beginning token within the vocabulary, sampling defaults
// that pass their own check, and chat templates that parsed.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/utf8.h"
#include "engines/transformer/config.h"
#include "engines/transformer/model_directory.h"
#include "engines/transformer/packed_model.h"
#include "fuzz/fixed_tokenizer.h"
#include "fuzz/fuzz_check.h"

namespace {

using namespace warmpool;
using namespace warmpool::transformer;

constexpr uint32_t kVocab = 300;  // the fixed tokenizer's 261 tokens, and room

void CheckRefusal(const Status& status) {
  FUZZ_CHECK(status.code() == Code::kInvalidArgument);
  FUZZ_CHECK(IsValidUtf8(status.message()));
}

void CheckConfig(std::string_view text) {
  Result<Config> parsed = Config::Parse(text, "/models/m/config.json");
  if (!parsed.ok()) return CheckRefusal(parsed.status());
  const Config& c = *parsed;
  FUZZ_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers > 0 && c.intermediate_size > 0);
  FUZZ_CHECK(c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim > 0 && c.head_dim % 2 == 0);
  FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0);
  FUZZ_CHECK(uint64_t{c.num_attention_heads} * c.head_dim <= (1u << 20));
  FUZZ_CHECK(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps) && c.rope_theta > 0 && std::isfinite(c.rope_theta));
  const std::vector<double> frequencies = c.RotaryFrequencies();
  FUZZ_CHECK(frequencies.size() == c.head_dim / 2);
  for (double f : frequencies) FUZZ_CHECK(std::isfinite(f) && f > 0);
  // The most a registration can ask for: the whole context, for the most sequences.
  const uint32_t context = ServedContext(c, static_cast<uint32_t>(std::min<uint64_t>(c.max_position_embeddings, UINT32_MAX)));
  FUZZ_CHECK(context >= 1);
  const unsigned __int128 cache = static_cast<unsigned __int128>(c.KvBytesPerToken()) * context * kMaxSequences;
  FUZZ_CHECK(cache < (static_cast<unsigned __int128>(1) << 64));
  FUZZ_CHECK(WorkspaceBytes(c, context, kMaxSequences) >= static_cast<uint64_t>(cache));
}

void CheckServingFiles(const TextFiles& files) {
  Result<ServingFiles> parsed = ServingFiles::Parse(files, kVocab, "/models/m");
  if (!parsed.ok()) return CheckRefusal(parsed.status());
  FUZZ_CHECK(!parsed->end_tokens.empty());
  for (int32_t id : parsed->end_tokens) FUZZ_CHECK(id >= 0 && static_cast<uint32_t>(id) < kVocab);
  if (parsed->bos) FUZZ_CHECK(*parsed->bos >= 0 && static_cast<uint32_t>(*parsed->bos) < kVocab);
  FUZZ_CHECK(CheckSamplingOptions(parsed->sampling).ok());
  FUZZ_CHECK(parsed->chat_template.empty() == (parsed->chat == nullptr));
  FUZZ_CHECK(parsed->tools_template.empty() == (parsed->chat_tools == nullptr));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string tokenizer = fuzz::ByteLevelTokenizerJson();
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view parts[3];
  std::string_view rest = input;
  for (int i = 0; i < 3 && !rest.empty(); ++i) {
    const size_t end = i < 2 ? rest.find('\0') : std::string_view::npos;
    parts[i] = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
  }
  CheckConfig(parts[0]);
  TextFiles files;
  files.tokenizer = tokenizer;
  files.tokenizer_config = std::string(parts[1]);
  files.generation_config = std::string(parts[2]);
  CheckServingFiles(files);
  return 0;
}
