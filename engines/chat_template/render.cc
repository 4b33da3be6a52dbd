// A chat template parsed and rendered (chat_template.h); the renderer is renderer.h.
#include "engines/chat_template/renderer.h"

namespace warmpool::chat {

Result<ChatTemplate> ChatTemplate::Parse(const std::string& source) {
  Result<Body> body = ParseTemplate(source);
  if (!body.ok()) return Error(Code::kInvalidArgument, "chat template: {}", body.status().message());
  ChatTemplate t;
  t.body_ = std::make_shared<const Body>(std::move(*body));
  return t;
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context, const RenderLimits& limits) const {
  Value variables = context.is_object() ? FromJson(context) : Value::MakeDict();
  Result<std::string> out = Renderer(limits, std::move(variables)).Run(*body_);
  if (!out.ok()) return Error(Code::kInvalidArgument, "chat template: {}", out.status().message());
  return out;
}

}  // namespace warmpool::chat
