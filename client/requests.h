// Every request of the protocol as a ready envelope, so that no caller (the CLI, the harness, the
// benchmark, the tests) builds one by hand: the request_id and the protocol version are the
// client's to set when it sends.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "client/matrix.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::client {

struct LoadOptions {
  uint32_t replicas = 0;                // 0: as configured
  std::optional<int64_t> keep_alive_ms;  // absent: the model's; 0: release when idle; < 0: never
};

struct InferOptions {
  uint32_t deadline_ms = 0;              // 0: the daemon's default
  std::optional<int64_t> keep_alive_ms;
};

struct FaultSpec {
  std::string point;   // e.g. "infer.mid"
  std::string action;  // kill | segv | abort | hang | exit:N | delay:MS
  std::string model;   // empty: any model
  uint32_t after = 0;  // fire on the Nth matching job (0 or 1: the first)
  uint32_t times = 0;  // shots in all (0: 1)
};

v1::Envelope LoadRequest(const std::string& model, const LoadOptions& options = {});
// park: keep a host copy so that the next load is a copy back.
v1::Envelope UnloadRequest(const std::string& model, bool park = false);
v1::Envelope UnloadAllRequest();
v1::Envelope InferRequest(const std::string& model, const Matrix& input,
                          const InferOptions& options = {});
// Shared memory: register a region (its memfd goes with the frame), or let one go.
v1::Envelope RegionRequest(uint64_t bytes);
v1::Envelope RegionRemoveRequest(uint64_t region);
// Inference on tensors in a registered region: the input is rows x cols f32 at input_offset; the
// output goes at output_offset when it fits in output_bytes (else it comes in the reply).
struct RegionTensors {
  uint64_t region = 0;
  uint32_t rows = 0;
  uint32_t cols = 0;
  uint64_t input_offset = 0;
  uint64_t output_offset = 0;
  uint64_t output_bytes = 0;
};
v1::Envelope InferInRegionRequest(const std::string& model, const RegionTensors& tensors,
                                  const InferOptions& options = {});
v1::Envelope PinRequest(const std::string& model, bool pin);
// path: absolute (the daemon resolves it under its model roots); engine empty: from the file.
v1::Envelope RegisterRequest(const std::string& model, const std::string& path,
                             const std::string& engine = "");
v1::Envelope UnregisterRequest(const std::string& model);
v1::Envelope FaultArmRequest(const FaultSpec& fault);
v1::Envelope FaultClearRequest();
v1::Envelope ModelsRequest();
v1::Envelope PsRequest();
v1::Envelope StatusRequest();

}  // namespace warmpool::client
