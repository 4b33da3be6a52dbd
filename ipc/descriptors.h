// Which messages carry descriptors, and how many: the one rule every receiver follows.
//
// A descriptor travels as SCM_RIGHTS with the first byte of its message's frame, but a stream socket
// does not say which frame it came with (recvmsg may return it together with earlier frames'
// bytes), so a receiver queues what arrives (Connection::TakeFd, BlockingChannel::TakeFd) and takes
// as many as the message it is handling says it carries, in the order listed here. A receiver that
// took one too few would hand the next message a descriptor that is not its own; one too many would
// steal it. So the count depends only on the message, never on the receiver's state, and the sender
// attaches exactly that many (when it cannot, it sends an error or a body that carries none).
//
//   Envelope (client -> warmpoold)
//     region, unless remove           1  the client's memfd
//     takeover                        1  one end of the new daemon's socketpair
//   WorkerEnvelope (warmpoold -> worker)
//     load with a path                1  the model file, opened beneath its root
//     attach                        0-2  the weights region (weight_bytes > 0), then the KV cache
//                                        region an engine of them left (kv_cache)
//     allocated without an error      1  the device memory granted
//     offer                           1  memory to reuse
//     infer                         0-3  input_region's memfd, then output_region's, then the
//                                        KV cache region of kv_source
//   WorkerEnvelope (worker -> warmpoold)
//     load_done                     0-2  the weights region (weights_shared), then the KV cache
//                                        region (cache_shared)
//     park_done                     0-2  the host copy (copy_shared), then the host copy of a GPU's
//                                        KV pool (cache_copy)
//   OwnerEnvelope (owner -> warmpoold)
//     allocated, no error, no handle  1  the exported allocation (vmm; legacy names it in ipc_handle)
//
// Every other message carries none. (The takeover's own socketpair and the service manager's store
// pass named descriptors, not envelopes: supervisor/takeover.cc, supervisor/warm_store.cc.)
#pragma once

#include "ipc/warmpool.pb.h"
#include "ipc/owner.pb.h"
#include "ipc/worker.pb.h"

namespace warmpool::ipc {

int DescriptorsCarried(const v1::Envelope& message);
int DescriptorsCarried(const v1::WorkerEnvelope& message);
int DescriptorsCarried(const v1::OwnerEnvelope& message);

}  // namespace warmpool::ipc
