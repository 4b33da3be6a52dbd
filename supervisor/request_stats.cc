#include "supervisor/request_stats.h"

#include <optional>
#include <string>

namespace warmpool::supervisor {

namespace {

struct Named {
  shm::RequestKind kind;
  const std::string* model;
};

std::optional<Named> ModelRequest(const v1::Envelope& e) {
  using K = shm::RequestKind;
  switch (e.body_case()) {
    case v1::Envelope::kInfer: return Named{K::kInfer, &e.infer().model()};
    case v1::Envelope::kLoad: return Named{K::kLoad, &e.load().model()};
    case v1::Envelope::kUnload:
      if (e.unload().all()) return std::nullopt;
      return Named{K::kUnload, &e.unload().model()};
    case v1::Envelope::kPin: return Named{K::kPin, &e.pin().model()};
    case v1::Envelope::kRegisterModel: return Named{K::kRegister, &e.register_model().model()};
    case v1::Envelope::kGenerate: return Named{K::kGenerate, &e.generate().model()};
    case v1::Envelope::kEmbed: return Named{K::kEmbed, &e.embed().model()};
    default: return std::nullopt;
  }
}

}  // namespace

void RequestStats::Received(uint64_t session, const v1::Envelope& request,
                            const std::function<uint32_t(const std::string&)>& resolve, uint64_t now_ns) {
  std::optional<Named> named = ModelRequest(request);
  if (!named) return;
  const uint32_t model = resolve(*named->model);
  if (model == shm::kNil) return;
  Pending p{model, shm::StatLoad(view_.model_stats(model).generation), named->kind, now_ns};
  sessions_[session][request.request_id()] = p;
}

void RequestStats::Answered(uint64_t session, const v1::Envelope& reply, uint64_t now_ns) {
  if (reply.has_generate_chunk()) return;  // a stream's part: its final reply answers it
  auto s = sessions_.find(session);
  if (s == sessions_.end()) return;
  auto it = s->second.find(reply.request_id());
  if (it == s->second.end()) return;
  const Pending p = it->second;
  s->second.erase(it);
  if (s->second.empty()) sessions_.erase(s);
  shm::ModelStats& stats = view_.model_stats(p.model);
  if (shm::StatLoad(stats.generation) != p.generation) return;
  uint32_t code = reply.has_error() ? static_cast<uint32_t>(reply.error().code()) : 0;
  if (code >= shm::kCodes) code = static_cast<uint32_t>(v1::INTERNAL);
  shm::StatAdd(stats.requests[static_cast<uint32_t>(p.kind)][code]);
  if (p.kind == shm::RequestKind::kInfer) shm::Observe(stats.infer_seconds, now_ns - p.received_ns);
}

void RequestStats::SessionGone(uint64_t session) { sessions_.erase(session); }

size_t RequestStats::pending() const {
  size_t n = 0;
  for (const auto& [id, requests] : sessions_) n += requests.size();
  return n;
}

}  // namespace warmpool::supervisor
