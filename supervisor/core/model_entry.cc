#include "supervisor/core/model_entry.h"

#include <cctype>

#include "ipc/file_version_proto.h"

namespace warmpool::supervisor {

WeightsDescription FromWire(const v1::ModelWeights& wire) {
  WeightsDescription d;
  d.header = wire.header();
  d.file_size = wire.file_size();
  if (wire.has_file_version()) d.version = ipc::FileVersionFrom(wire.file_version());
  d.weight_bytes = wire.weight_bytes();
  d.workspace_bytes = wire.workspace_bytes();
  d.in_features = wire.in_features();
  d.out_features = wire.out_features();
  d.context = wire.context();
  d.kv_bytes_per_token = wire.kv_bytes_per_token();
  d.embedding_size = wire.embedding_size();
  d.embeds_only = wire.embeds_only();
  d.sequences = wire.sequences();
  d.kv_tokens = wire.kv_tokens();
  d.prefill_stretch = wire.prefill_stretch();
  d.runs_tensors = wire.runs_tensors();
  d.inputs.assign(wire.inputs().begin(), wire.inputs().end());
  d.outputs.assign(wire.outputs().begin(), wire.outputs().end());
  return d;
}

void ToWire(const WeightsDescription& d, v1::ModelWeights* wire) {
  wire->set_header(d.header);
  wire->set_file_size(d.file_size);
  if (d.version != FileVersion{}) ipc::SetFileVersion(wire->mutable_file_version(), d.version);
  wire->set_weight_bytes(d.weight_bytes);
  wire->set_workspace_bytes(d.workspace_bytes);
  wire->set_in_features(d.in_features);
  wire->set_out_features(d.out_features);
  wire->set_context(d.context);
  wire->set_kv_bytes_per_token(d.kv_bytes_per_token);
  wire->set_embedding_size(d.embedding_size);
  wire->set_embeds_only(d.embeds_only);
  wire->set_sequences(d.sequences);
  wire->set_kv_tokens(d.kv_tokens);
  wire->set_prefill_stretch(d.prefill_stretch);
  wire->set_runs_tensors(d.runs_tensors);
  for (const v1::NamedTensor& t : d.inputs) *wire->add_inputs() = t;
  for (const v1::NamedTensor& t : d.outputs) *wire->add_outputs() = t;
}

Status CheckModelName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 63 && name[0] != '.';
  for (char c : name) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  }
  if (!ok) {
    return Error(Code::kInvalidArgument,
                 "model name \"{}\" must be 1 to 63 characters of letters, digits, '.', '_' or '-' "
                 "and not start with '.'",
                 name);
  }
  return OkStatus();
}

}  // namespace warmpool::supervisor
