#include "client/requests.h"

namespace warmpool::client {

v1::Envelope LoadRequest(const std::string& model, const LoadOptions& options) {
  v1::Envelope e;
  v1::LoadRequest* r = e.mutable_load();
  r->set_model(model);
  r->set_replicas(options.replicas);
  if (options.keep_alive_ms) r->set_keep_alive_ms(*options.keep_alive_ms);
  return e;
}

v1::Envelope UnloadRequest(const std::string& model, bool park) {
  v1::Envelope e;
  e.mutable_unload()->set_model(model);
  e.mutable_unload()->set_park(park);
  return e;
}

v1::Envelope UnloadAllRequest() {
  v1::Envelope e;
  e.mutable_unload()->set_all(true);
  return e;
}

v1::Envelope InferRequest(const std::string& model, const Matrix& input,
                          const InferOptions& options) {
  v1::Envelope e;
  v1::InferRequest* r = e.mutable_infer();
  r->set_model(model);
  *r->mutable_input() = ToTensor(input);
  r->set_deadline_ms(options.deadline_ms);
  if (options.keep_alive_ms) r->set_keep_alive_ms(*options.keep_alive_ms);
  return e;
}

v1::Envelope RegionRequest(uint64_t bytes) {
  v1::Envelope e;
  e.mutable_region()->set_bytes(bytes);
  return e;
}

v1::Envelope RegionRemoveRequest(uint64_t region) {
  v1::Envelope e;
  e.mutable_region()->set_remove(region);
  return e;
}

v1::Envelope InferInRegionRequest(const std::string& model, const RegionTensors& tensors,
                                  const InferOptions& options) {
  v1::Envelope e;
  v1::InferRequest* r = e.mutable_infer();
  r->set_model(model);
  r->mutable_input()->set_rows(tensors.rows);
  r->mutable_input()->set_cols(tensors.cols);
  v1::RegionSlice* in = r->mutable_input_region();
  in->set_region(tensors.region);
  in->set_offset(tensors.input_offset);
  in->set_bytes(uint64_t{tensors.rows} * tensors.cols * sizeof(float));
  if (tensors.output_bytes != 0) {
    v1::RegionSlice* out = r->mutable_output_region();
    out->set_region(tensors.region);
    out->set_offset(tensors.output_offset);
    out->set_bytes(tensors.output_bytes);
  }
  r->set_deadline_ms(options.deadline_ms);
  if (options.keep_alive_ms) r->set_keep_alive_ms(*options.keep_alive_ms);
  return e;
}

v1::Envelope PinRequest(const std::string& model, bool pin) {
  v1::Envelope e;
  e.mutable_pin()->set_model(model);
  e.mutable_pin()->set_pin(pin);
  return e;
}

v1::Envelope RegisterRequest(const std::string& model, const std::string& path,
                             const std::string& engine) {
  v1::Envelope e;
  v1::RegisterRequest* r = e.mutable_register_model();
  r->set_model(model);
  r->set_path(path);
  r->set_engine(engine);
  return e;
}

v1::Envelope UnregisterRequest(const std::string& model) {
  v1::Envelope e;
  e.mutable_register_model()->set_model(model);
  e.mutable_register_model()->set_remove(true);
  return e;
}

v1::Envelope FaultArmRequest(const FaultSpec& fault) {
  v1::Envelope e;
  v1::FaultArmRequest* r = e.mutable_fault_arm();
  r->set_point(fault.point);
  r->set_action(fault.action);
  r->set_model(fault.model);
  r->set_after(fault.after);
  r->set_times(fault.times);
  return e;
}

v1::Envelope FaultClearRequest() {
  v1::Envelope e;
  e.mutable_fault_clear();
  return e;
}

v1::Envelope ModelsRequest() {
  v1::Envelope e;
  e.mutable_models();
  return e;
}

v1::Envelope PsRequest() {
  v1::Envelope e;
  e.mutable_ps();
  return e;
}

v1::Envelope StatusRequest() {
  v1::Envelope e;
  e.mutable_status();
  return e;
}

}  // namespace warmpool::client
