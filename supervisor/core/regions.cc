// Clients' shared memory (Triton's system shared-memory extension is the model): a client
// registers a memfd once per connection and then names tensors in it by offset, so that large
// inputs and outputs never pass through the daemon. The core keeps each region's descriptor and
// hands a duplicate to the worker with every request that uses it; a worker maps a region once
// and keeps it mapped until told the region is gone (WorkerRegionsGone). A region is the connection's alone: another connection
// cannot name it, and it is closed when the connection goes or the client removes it. A request
// that waits while its region is removed fails when its turn comes.
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

void Core::HandleRegion(const Call& call, const v1::RegionRequest& request, int handle,
                        const Status& check) {
  Session& session = sessions_[call.session];
  v1::Envelope reply;
  if (request.remove() != 0) {
    Close(handle);  // nothing should come with a removal
    auto it = session.regions.find(request.remove());
    if (it == session.regions.end()) {
      return AnswerError(call, Error(Code::kNotFound,
                                     "this connection has no region {} (regions belong to the "
                                     "connection that registered them)",
                                     request.remove()));
    }
    Close(it->second.handle);
    session.regions.erase(it);
    regions_--;
    ForgetRegions({request.remove()});
    reply.mutable_region_reply()->set_region(request.remove());
    reply.mutable_region_reply()->set_removed(true);
    return Answer(call, std::move(reply));
  }
  if (handle < 0) {
    return AnswerError(call, Error(Code::kInvalidArgument,
                                   "a region request must carry its memfd (SCM_RIGHTS with the "
                                   "frame's first byte)"));
  }
  if (!check.ok()) {
    Close(handle);
    return AnswerError(call, check);
  }
  if (session.regions.size() >= kMaxRegionsPerConnection) {
    Close(handle);
    return AnswerError(call, Error(Code::kResourceExhausted,
                                   "this connection already has {} regions registered: remove one "
                                   "first, or use fewer, larger regions",
                                   session.regions.size()));
  }
  if (regions_ >= kMaxRegions) {
    Close(handle);
    return AnswerError(call, Error(Code::kResourceExhausted,
                                   "the daemon holds {} regions for its clients: retry later, or send "
                                   "this tensor in the request",
                                   regions_));
  }
  regions_++;
  const uint64_t id = next_region_++;
  session.regions[id] = ClientRegion{handle, request.bytes()};
  reply.mutable_region_reply()->set_region(id);
  reply.mutable_region_reply()->set_bytes(request.bytes());
  Answer(call, std::move(reply));
}

Result<const Core::ClientRegion*> Core::FindRegion(uint64_t session, const v1::RegionSlice& slice,
                                                   const char* what) const {
  auto s = sessions_.find(session);
  const ClientRegion* region = nullptr;
  if (s != sessions_.end()) {
    auto it = s->second.regions.find(slice.region());
    if (it != s->second.regions.end()) region = &it->second;
  }
  if (region == nullptr) {
    return Error(Code::kFailedPrecondition,
                 "{} names region {}, which this connection has not registered (or removed)", what,
                 slice.region());
  }
  // The request check made sure offset + bytes does not wrap.
  if (slice.offset() + slice.bytes() > region->bytes) {
    return Error(Code::kInvalidArgument, "{} (offset {}, {} bytes) ends past region {} ({} bytes)",
                 what, slice.offset(), slice.bytes(), slice.region(), region->bytes);
  }
  return region;
}

Status Core::CheckRegions(uint64_t session, const v1::InferRequest& request) const {
  if (request.has_input_region()) {
    if (auto h = FindRegion(session, request.input_region(), "input_region"); !h.ok()) {
      return h.status();
    }
  }
  if (request.has_output_region()) {
    if (auto h = FindRegion(session, request.output_region(), "output_region"); !h.ok()) {
      return h.status();
    }
  }
  return OkStatus();
}

void Core::CloseRegions(Session& session) {
  std::vector<uint64_t> ids;
  for (auto& [id, region] : session.regions) {
    Close(region.handle);
    ids.push_back(id);
  }
  regions_ -= static_cast<uint32_t>(session.regions.size());
  session.regions.clear();
  ForgetRegions(ids);
}

void Core::ForgetRegions(const std::vector<uint64_t>& ids) {
  if (ids.empty()) return;
  // Every worker that is up may have mapped them; one that starts later never saw them.
  v1::WorkerEnvelope message;
  for (uint64_t id : ids) message.mutable_regions_gone()->add_regions(id);
  for (uint32_t slot = 0; slot < workers_.size(); ++slot) {
    if (workers_[slot].state == WorkerSlot::State::kUp) Send(slot, message);
  }
}

}  // namespace warmpool::supervisor
