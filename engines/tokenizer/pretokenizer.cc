#include "engines/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/utf8.h"

namespace warmpool::tokenizer {

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;
RegexSplitter::~RegexSplitter() = default;

Result<RegexSplitter> RegexSplitter::Compile(std::string_view pattern, std::string_view source) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Error(Code::kInvalidArgument, "{}: the pre-tokenizer's pattern does not compile at offset {}: {}", source,
                 offset, reinterpret_cast<const char*>(message));
  }
  // The JIT is several times faster where the platform has it; without it the interpreter runs.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  RegexSplitter splitter;
  splitter.compiled_ = std::make_unique<Compiled>();
  splitter.compiled_->code = code;
  return splitter;
}

Status RegexSplitter::Split(std::string_view text, std::vector<std::string_view>* pieces) const {
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  if (match == nullptr) return Error(Code::kResourceExhausted, "no memory for a regular expression match");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;       // where the next search starts
  size_t emitted = 0;  // text before this is in pieces
  Status status;
  while (at <= text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      status = Error(Code::kInvalidArgument, "pre-tokenizing failed: {}", reinterpret_cast<const char*>(message));
      break;
    }
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match);
    const size_t begin = range[0], end = range[1];
    if (begin > emitted) pieces->push_back(text.substr(emitted, begin - emitted));
    if (end > begin) {
      pieces->push_back(text.substr(begin, end - begin));
      emitted = at = end;
    } else {
      // An empty match: the text after it is searched from the next character on.
      emitted = begin;
      if (begin >= text.size()) break;
      const size_t length = Utf8SequenceLength(text.substr(begin));
      at = begin + (length == 0 ? 1 : length);
    }
  }
  if (status.ok() && emitted < text.size()) pieces->push_back(text.substr(emitted));
  pcre2_match_data_free(match);
  return status;
}

}  // namespace warmpool::tokenizer
