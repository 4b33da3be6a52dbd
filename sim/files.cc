#include "sim/files.h"

#include <fmt/format.h>

#include <cstdio>

namespace warmpool::sim {

std::string HeaderOf(const SimFile& file) {
  return fmt::format("simheader {} {} {}", file.id, file.version, file.WeightBytes());
}

std::optional<Described> ParseHeader(const std::string& header) {
  Described d;
  unsigned long long bytes = 0;
  if (std::sscanf(header.c_str(), "simheader %u %u %llu", &d.file, &d.version, &bytes) != 3) {
    return std::nullopt;
  }
  d.weight_bytes = bytes;
  return d;
}

FileVersion VersionOf(const SimFile& file) {
  return FileVersion{HeaderOf(file).size() + file.WeightBytes(), file.version, file.id + 1u, 1, file.version};
}

supervisor::ModelEntry EntryOf(const SimFile& file) {
  supervisor::ModelEntry e;
  e.name = file.name;
  e.engine = file.echo ? "echo" : file.language ? "transformer" : "dense";
  e.path = file.path;
  if (file.echo) return e;
  e.in_features = file.language ? 0 : 4;
  e.out_features = file.language ? 0 : 4;
  if (file.language) {
    e.context = kSimContext;
    e.kv_bytes_per_token = kSimKvBytesPerToken;
  }
  if (file.broken) {
    e.problem = Error(Code::kInvalidArgument, "model file \"{}\": header is not valid JSON", file.path);
    e.problem_in_file = true;
    return e;
  }
  e.weight_bytes = file.WeightBytes();
  e.workspace_bytes = file.workspace_bytes;
  e.header = HeaderOf(file);
  e.file_size = e.header.size() + e.weight_bytes;
  e.version = VersionOf(file);
  return e;
}

namespace {

std::string Shape(const v1::Tensor& t) { return fmt::format("{}x{}", t.rows(), t.cols()); }

}  // namespace

std::string Brief(const v1::Envelope& message) {
  if (message.has_infer()) {
    v1::Envelope copy = message;
    copy.mutable_infer()->mutable_input()->clear_data();
    return copy.ShortDebugString() + " (" + Shape(message.infer().input()) + ")";
  }
  return message.ShortDebugString().substr(0, 160);
}

std::string Brief(const v1::WorkerEnvelope& message) {
  if (message.has_infer() || message.has_infer_done()) {
    v1::WorkerEnvelope copy = message;
    if (copy.has_infer()) copy.mutable_infer()->mutable_input()->clear_data();
    if (copy.has_infer_done()) copy.mutable_infer_done()->mutable_output()->clear_data();
    return copy.ShortDebugString();
  }
  return message.ShortDebugString().substr(0, 160);
}

}  // namespace warmpool::sim
