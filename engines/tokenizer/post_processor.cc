#include "engines/tokenizer/post_processor.h"

#include <cstdint>

#include <nlohmann/json.hpp>

#include "engines/json_describe.h"
#include "engines/tokenizer/json_fields.h"

namespace warmpool::tokenizer {
namespace {

using Json = nlohmann::json;

Status ParseTemplate(const Json& processor, std::string_view source, PostProcessor* out) {
  const Json& single = FieldOf(processor, "single");
  const Json& specials = FieldOf(processor, "special_tokens");
  if (!single.is_array() || !specials.is_object()) {
    return Error(Code::kInvalidArgument, "{}: TemplateProcessing without a \"single\" template", source);
  }
  bool seen_text = false;
  for (const Json& item : single) {
    if (item.contains("Sequence")) {
      if (seen_text || item["Sequence"].value("id", "") != "A") {
        return Error(Code::kInvalidArgument, "{}: TemplateProcessing's single template must hold $A once", source);
      }
      seen_text = true;
      continue;
    }
    const std::string name = item.contains("SpecialToken") ? item["SpecialToken"].value("id", "") : "";
    auto special = specials.find(name);
    if (special == specials.end() || !special->contains("ids") || !(*special)["ids"].is_array()) {
      return Error(Code::kInvalidArgument, "{}: TemplateProcessing names special token \"{}\" without its ids", source,
                   name);
    }
    for (const Json& id : (*special)["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return Error(Code::kInvalidArgument, "{}: special token \"{}\" has id {}", source, name, DescribeJson(id));
      }
      (seen_text ? out->after : out->before).push_back(id.get<int32_t>());
    }
  }
  if (!seen_text) return Error(Code::kInvalidArgument, "{}: TemplateProcessing's single template has no $A", source);
  return OkStatus();
}

Status Parse(const Json& processor, std::string_view source, PostProcessor* out) {
  const std::string type = TypeOf(processor);
  if (processor.is_null() || type == "ByteLevel") return OkStatus();
  if (type == "TemplateProcessing") return ParseTemplate(processor, source, out);
  if (type == "Sequence") {
    for (const Json& step : FieldOf(processor, "processors")) {
      if (TypeOf(step) == "Sequence") {
        return Error(Code::kInvalidArgument, "{}: nested post-processor sequences are not supported", source);
      }
      if (Status s = Parse(step, source, out); !s.ok()) return s;
    }
    return OkStatus();
  }
  return Error(Code::kInvalidArgument,
               "{}: post-processor \"{}\" is not supported (supported: TemplateProcessing, ByteLevel, a Sequence of them)",
               source, type);
}

}  // namespace

Result<PostProcessor> ParsePostProcessor(const Json& processor, std::string_view source) {
  PostProcessor out;
  if (Status s = Parse(processor, source, &out); !s.ok()) return s;
  return out;
}

}  // namespace warmpool::tokenizer
