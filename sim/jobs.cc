// What a simulated worker does with each job it reads (Simulator::RunJob): loads, attaches, infers
// (a matrix, typed tensors), unloads and parks, as worker/worker.cc does them; a generation's
// steps are sim/generate.cc's.
#include <cstring>

#include <fmt/format.h>

#include "ipc/error_proto.h"
#include "ipc/file_version_proto.h"
#include "sim/simulator.h"

namespace warmpool::sim {
namespace {

void SetError(v1::Error* e, Code code, const std::string& text) {
  e->set_code(ipc::ToProto(code));
  e->set_message(text);
}

}  // namespace

v1::WorkerEnvelope Simulator::RunJob(Worker& w, const WorkerJob& work, std::vector<int>& out) {
  const v1::WorkerEnvelope& m = work.message;
  if (m.has_load()) return RunLoad(w, work, out);
  if (m.has_attach()) return RunAttach(w, work, out);
  if (m.has_infer() && m.infer().inputs_size() > 0) return RunTypedInfer(w, work, out);
  if (m.has_infer()) return RunInfer(w, work, out);
  if (m.has_unload()) return RunUnload(w, work, out);
  if (m.has_park()) return RunPark(w, work, out);
  return {};
}

v1::WorkerEnvelope Simulator::RunLoad(Worker& w, const WorkerJob& work, std::vector<int>& out) {
  v1::WorkerEnvelope reply;
  const v1::WorkerEnvelope& m = work.message;
  // As worker.cc: the header read when the load began describes the weights; a file that needs
  // more than admitted, or that changed while it was read, is reported and not loaded.
  v1::WorkerLoadDone* done = reply.mutable_load_done();
  done->set_job(m.load().job());
  const SimFile* file = FileOf(m.load().name(), m.load().path());
  if (file == nullptr || file->broken || !work.read) {
    SetError(done->mutable_error(), Code::kInvalidArgument, "model file is not a model");
    return reply;
  }
  const SimFile& read = *work.read;
  v1::ModelWeights* weights = done->mutable_weights();
  weights->set_weight_bytes(read.WeightBytes());
  weights->set_workspace_bytes(read.echo ? 0 : read.workspace_bytes);
  weights->set_in_features(read.echo || read.language ? 0 : 6);
  weights->set_out_features(read.echo || read.language ? 0 : 6);
  if (read.language) {
    weights->set_context(kSimContext);
    weights->set_kv_bytes_per_token(kSimKvBytesPerToken);
    weights->set_sequences(kSimSequences);
  }
  if (!read.echo) {
    weights->set_header(HeaderOf(read));
    weights->set_file_size(HeaderOf(read).size() + read.WeightBytes());
    ipc::SetFileVersion(weights->mutable_file_version(), VersionOf(read));  // fstat of what it read
  }
  uint64_t needs = read.WeightBytes() + (read.echo ? 0 : read.workspace_bytes);
  if (m.load().admitted_bytes() != 0 && needs > m.load().admitted_bytes()) {
    done->set_file_changed(true);
    return reply;
  }
  if (!read.echo && (file->version != read.version)) {
    weights->set_header(HeaderOf(*file));
    weights->set_file_size(HeaderOf(*file).size() + file->WeightBytes());
    ipc::SetFileVersion(weights->mutable_file_version(), VersionOf(*file));
    weights->set_weight_bytes(file->WeightBytes());
    done->set_file_changed(true);
    return reply;
  }
  Engine e;
  e.name = m.load().name();
  if (!read.echo) {
    e.weights = true;
    e.region = Region{read.id, read.version, read.WeightBytes(), false, w.device};
    e.described = Described{read.id, read.version, read.WeightBytes()};
    done->set_weights_shared(true);
    out.push_back(NewSupervisorHandle(e.region));
  }
  if (read.language) {
    e.kv_on_device = ShareCache(w, e.region, *done, out);
    e.kv = NewKvPages();
  }
  w.engines[m.load().model()] = e;
  return reply;
}

v1::WorkerEnvelope Simulator::RunAttach(Worker& w, const WorkerJob& work, std::vector<int>& out) {
  v1::WorkerEnvelope reply;
  const v1::WorkerEnvelope& m = work.message;
  const v1::WorkerAttach& a = m.attach();
  v1::WorkerLoadDone* done = reply.mutable_load_done();
  done->set_job(a.job());
  Engine e;
  e.name = a.name();
  if (a.weights().weight_bytes() > 0) {
    if (work.region < 0) {
      SetError(done->mutable_error(), Code::kInternal, "attach came without its weights");
      return reply;
    }
    std::optional<Described> described = ParseHeader(a.weights().header());
    if (!described) {
      SetError(done->mutable_error(), Code::kInvalidArgument, "attach with a header that does not parse");
      return reply;
    }
    e.weights = true;
    e.region = regions_[work.region];
    e.described = *described;
    // A replica maps the weights where they are: memory of another device is not its own.
    if (!a.copy() && e.region.device != w.device) {
      Fail(fmt::format("worker {} of device {} was told to attach \"{}\", whose weights are on device {}",
                       w.slot, w.device, a.name(), e.region.device));
      return reply;
    }
    if (a.kv_cache()) CheckParkedCache(w, a, e.region, work.cache);
    if (a.copy()) {  // unpark: into new device memory, which the supervisor holds from now on
      e.region.host = false;
      e.region.device = w.device;
      done->set_weights_shared(true);
      out.push_back(NewSupervisorHandle(e.region));
    }
    v1::ModelWeights* weights = done->mutable_weights();
    *weights = a.weights();  // what it was told the weights are, with the sizes its engine measures
    weights->set_weight_bytes(described->weight_bytes);
    bool language = false;
    for (const SimFile& f : files_) {
      if (f.id == described->file) {
        weights->set_workspace_bytes(f.workspace_bytes);
        language = f.language;
      }
    }
    weights->set_in_features(language ? 0 : 6);
    weights->set_out_features(language ? 0 : 6);
    if (language) {
      weights->set_context(kSimContext);
      weights->set_kv_bytes_per_token(kSimKvBytesPerToken);
      e.kv_on_device = ShareCache(w, e.region, *done, out);
      e.kv = NewKvPages();
    }
  }
  w.engines[a.model()] = e;
  return reply;
}

// Typed tensors: never batched, bounded by a reply's frame; the simulated engines answer them as
// the same rows sent as a matrix, the output named as the input was.
v1::WorkerEnvelope Simulator::RunTypedInfer(Worker& w, const WorkerJob& work, std::vector<int>& out) {
  const v1::WorkerInfer& in = work.message.infer();
  if (in.batch() || in.max_output_bytes() == 0) {
    Fail(fmt::format("typed tensors reached worker {} {}", w.slot, in.batch() ? "to be batched" : "with no reply bound"));
  }
  WorkerJob as_matrix = work;
  v1::WorkerInfer* matrix = as_matrix.message.mutable_infer();
  const v1::NamedTensor& x = in.inputs(0);
  matrix->mutable_input()->set_rows(x.shape_size() == 2 ? static_cast<uint32_t>(x.shape(0)) : 0);
  matrix->mutable_input()->set_cols(x.shape_size() == 2 ? static_cast<uint32_t>(x.shape(1)) : 0);
  matrix->mutable_input()->set_data(x.data());
  matrix->clear_inputs();
  v1::WorkerEnvelope answered = RunInfer(w, as_matrix, out);
  v1::WorkerInferDone* done = answered.mutable_infer_done();
  if (!done->has_error()) {
    v1::NamedTensor* y = done->add_outputs();
    y->set_name(x.name());
    y->set_dtype(v1::DTYPE_F32);
    y->add_shape(done->output().rows());
    y->add_shape(done->output().cols());
    y->set_allocated_data(done->mutable_output()->release_data());
    done->clear_output();
    done->clear_batch_rows();
  }
  return answered;
}

v1::WorkerEnvelope Simulator::RunInfer(Worker& w, const WorkerJob& work, std::vector<int>& out) {
  v1::WorkerEnvelope reply;
  const v1::WorkerEnvelope& m = work.message;
  const v1::WorkerInfer& in = m.infer();
  v1::WorkerInferDone* done = reply.mutable_infer_done();
  done->set_job(in.job());
  auto it = w.engines.find(in.model());
  if (it == w.engines.end()) {
    SetError(done->mutable_error(), Code::kUnavailable,
              fmt::format("model {} is not loaded in worker {}", in.model(), w.slot));
    return reply;
  }
  if (in.deadline_unix_ms() != 0 && Now().unix_ns / 1000000 > static_cast<uint64_t>(in.deadline_unix_ms())) {
    SetError(done->mutable_error(), Code::kDeadlineExceeded, "the request's deadline passed before it ran");
    return reply;
  }
  if ((in.has_input_region() || in.has_output_region()) &&
      (work.region < 0 || !regions_[work.region].client)) {
    Fail(fmt::format("an inference on a client's region reached worker {} without the region", w.slot));
    return reply;
  }
  const Engine& e = it->second;
  v1::Tensor* out_t = done->mutable_output();
  out_t->set_rows(in.input().rows());
  if (!e.weights) {  // echo
    *out_t = in.input();
    return reply;
  }
  out_t->set_cols(6);
  std::vector<float> values(uint64_t{in.input().rows()} * 6, 0.0f);
  float token = 0;  // none for an input in a region
  if (in.input().data().size() >= sizeof(float)) std::memcpy(&token, in.input().data().data(), sizeof(float));
  values[0] = token;
  values[1] = static_cast<float>(e.region.file);
  values[2] = static_cast<float>(e.region.version);
  values[3] = static_cast<float>(e.described.file);
  values[4] = static_cast<float>(e.described.version);
  out_t->set_data(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return reply;
}

v1::WorkerEnvelope Simulator::RunUnload(Worker& w, const WorkerJob& work, std::vector<int>& out) {
  v1::WorkerEnvelope reply;
  const v1::WorkerEnvelope& m = work.message;
  reply.mutable_unload_done()->set_job(m.unload().job());
  w.engines.erase(m.unload().model());
  return reply;
}

v1::WorkerEnvelope Simulator::RunPark(Worker& w, const WorkerJob& work, std::vector<int>& out) {
  v1::WorkerEnvelope reply;
  const v1::WorkerEnvelope& m = work.message;
  v1::WorkerParkDone* done = reply.mutable_park_done();
  done->set_job(m.park().job());
  auto it = w.engines.find(m.park().model());
  if (it == w.engines.end()) {
    SetError(done->mutable_error(), Code::kUnavailable, "model is not loaded in this worker");
  } else if (!it->second.weights) {
    SetError(done->mutable_error(), Code::kFailedPrecondition, "the model has no weights to park");
  } else {
    Region host = it->second.region;
    host.host = true;
    done->set_bytes(host.bytes);
    done->set_copy_shared(true);
    out.push_back(NewSupervisorHandle(host));
    if (m.park().cache_copy()) CopyCacheToPark(w, it->second, m.park().model(), *done, out);
  }
  return reply;
}

}  // namespace warmpool::sim
