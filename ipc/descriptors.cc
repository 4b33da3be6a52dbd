#include "ipc/descriptors.h"

namespace warmpool::ipc {

int DescriptorsCarried(const v1::Envelope& message) {
  switch (message.body_case()) {
    case v1::Envelope::kRegion: return message.region().remove() == 0 ? 1 : 0;
    case v1::Envelope::kTakeover: return 1;
    default: return 0;
  }
}

int DescriptorsCarried(const v1::WorkerEnvelope& message) {
  switch (message.body_case()) {
    case v1::WorkerEnvelope::kLoad: return message.load().path().empty() ? 0 : 1;
    case v1::WorkerEnvelope::kAttach:
      return (message.attach().weights().weight_bytes() > 0 ? 1 : 0) + (message.attach().kv_cache() ? 1 : 0);
    case v1::WorkerEnvelope::kAllocated: return message.allocated().has_error() ? 0 : 1;
    case v1::WorkerEnvelope::kOffer: return 1;
    case v1::WorkerEnvelope::kInfer:
      return (message.infer().has_input_region() ? 1 : 0) + (message.infer().has_output_region() ? 1 : 0) +
             (message.infer().kv_source() ? 1 : 0);
    case v1::WorkerEnvelope::kLoadDone:
      return (message.load_done().weights_shared() ? 1 : 0) + (message.load_done().cache_shared() ? 1 : 0);
    case v1::WorkerEnvelope::kParkDone:
      return (message.park_done().copy_shared() ? 1 : 0) + (message.park_done().cache_copy() ? 1 : 0);
    default: return 0;
  }
}

int DescriptorsCarried(const v1::OwnerEnvelope& message) {
  if (!message.has_allocated()) return 0;
  const v1::OwnerAllocated& allocated = message.allocated();
  return allocated.has_error() || !allocated.ipc_handle().empty() ? 0 : 1;
}

}  // namespace warmpool::ipc
