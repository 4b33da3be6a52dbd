#include "engines/tokenizer/metaspace.h"

#include <nlohmann/json.hpp>

#include "engines/json_describe.h"
#include "engines/tokenizer/json_fields.h"

namespace warmpool::tokenizer {
namespace {

using Json = nlohmann::json;

bool IsReplace(const Json& j, std::string_view from, std::string_view to) {
  return TypeOf(j) == "Replace" && j.contains("pattern") && j["pattern"].is_object() &&
         j["pattern"].value("String", "") == from && j.value("content", "") == to;
}

}  // namespace

void Metaspace::Pieces(std::string_view text, bool at_start, std::vector<std::string>* pieces) const {
  if (text.empty()) return;
  std::string replaced;
  for (char c : text) {
    if (c == ' ') replaced += kMetaspace;
    else replaced += c;
  }
  if (prepend == Prepend::kNormalizer ||
      ((prepend == Prepend::kAlways || (prepend == Prepend::kFirst && at_start)) && !replaced.starts_with(kMetaspace))) {
    replaced.insert(0, kMetaspace);
  }
  if (!split) {
    pieces->push_back(std::move(replaced));
    return;
  }
  size_t start = 0;
  for (size_t at = replaced.find(kMetaspace, 1); at != std::string::npos; at = replaced.find(kMetaspace, at + 1)) {
    pieces->push_back(replaced.substr(start, at - start));
    start = at;
  }
  pieces->push_back(replaced.substr(start));
}

Result<Metaspace> ParseMetaspace(const Json& file, std::string_view source) {
  Metaspace m;
  const Json& normalizer = FieldOf(file, "normalizer");
  const Json& pre = FieldOf(file, "pre_tokenizer");
  const Json& decoder = FieldOf(file, "decoder");
  if (TypeOf(normalizer) == "Sequence" && pre.is_null()) {
    const Json& steps = FieldOf(normalizer, "normalizers");
    if (!(steps.is_array() && steps.size() == 2 && TypeOf(steps[0]) == "Prepend" &&
          steps[0].value("prepend", "") == kMetaspace && IsReplace(steps[1], " ", kMetaspace))) {
      return Error(Code::kInvalidArgument, "{}: normalizer {} is not supported (supported: Prepend '▁' then Replace ' ' "
                   "with '▁')", source, DescribeJson(normalizer));
    }
    m.prepend = Metaspace::Prepend::kNormalizer;
  } else if (normalizer.is_null() && TypeOf(pre) == "Metaspace") {
    if (pre.value("replacement", "") != kMetaspace) {
      return Error(Code::kInvalidArgument, "{}: a Metaspace pre-tokenizer with another replacement than '▁'", source);
    }
    const std::string scheme = pre.value("prepend_scheme", pre.value("add_prefix_space", true) ? "always" : "never");
    if (scheme == "first") m.prepend = Metaspace::Prepend::kFirst;
    else if (scheme == "never") m.prepend = Metaspace::Prepend::kNever;
    else if (scheme == "always") m.prepend = Metaspace::Prepend::kAlways;
    else return Error(Code::kInvalidArgument, "{}: Metaspace prepend_scheme \"{}\" is not supported", source, scheme);
    m.split = pre.value("split", true);
  } else {
    return Error(Code::kInvalidArgument,
                 "{}: this normalizer and pre-tokenizer are not supported for a byte-fallback BPE (supported: Prepend "
                 "and Replace normalizers, or a Metaspace pre-tokenizer)",
                 source);
  }
  if (TypeOf(decoder) == "Sequence") {
    const Json& steps = FieldOf(decoder, "decoders");
    const bool ok = steps.is_array() && steps.size() == 4 && IsReplace(steps[0], kMetaspace, " ") &&
                    TypeOf(steps[1]) == "ByteFallback" && TypeOf(steps[2]) == "Fuse" && TypeOf(steps[3]) == "Strip" &&
                    steps[3].value("content", "") == " " && steps[3].value("start", 0) == 1 &&
                    steps[3].value("stop", 0) == 0;
    if (!ok) {
      return Error(Code::kInvalidArgument, "{}: decoder {} is not supported (supported: Replace '▁', ByteFallback, "
                   "Fuse, Strip one leading space; or Metaspace)", source, DescribeJson(decoder));
    }
    m.strip_leading_space = true;
  } else if (TypeOf(decoder) == "Metaspace") {
    m.strip_leading_space = m.prepend != Metaspace::Prepend::kNever;
  } else {
    return Error(Code::kInvalidArgument, "{}: decoder \"{}\" is not supported for a byte-fallback BPE", source,
                 TypeOf(decoder));
  }
  return m;
}

}  // namespace warmpool::tokenizer
