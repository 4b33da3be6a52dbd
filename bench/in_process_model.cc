#include "bench/in_process_model.h"

#include <stdlib.h>

#include <filesystem>

#include "bench/language_model.h"
#include "engines/transformer/decode_attention.h"
#include "engines/transformer/random_checkpoint.h"

namespace warmpool::bench {

namespace tf = transformer;

InProcessModel::~InProcessModel() {
  cpu.reset();
  checkpoint.reset();
  if (!dir.empty()) std::filesystem::remove_all(dir);
}

Status OpenInProcessModel(uint32_t model_mib, uint32_t positions, uint32_t threads, InProcessModel& model) {
  char pattern[] = "/tmp/warmpool-bench-model-XXXXXX";
  if (mkdtemp(pattern) == nullptr) return Error(Code::kInternal, "mkdtemp failed");
  model.dir = pattern;
  tf::RandomCheckpoint spec = LanguageModelShape(model_mib);
  spec.vocab_size = 32000;
  spec.max_position_embeddings = positions;
  if (Status s = tf::WriteRandomCheckpoint(model.dir, spec); !s.ok()) return s;
  Result<std::unique_ptr<tf::Checkpoint>> checkpoint = tf::Checkpoint::Open(model.dir);
  if (!checkpoint.ok()) return checkpoint.status();
  model.checkpoint = std::move(*checkpoint);
  Result<tf::ModelWeights> weights =
      tf::BindWeights(model.checkpoint->config(), model.checkpoint->tensors(), model.dir);
  if (!weights.ok()) return weights.status();
  model.weights = std::move(*weights);
  model.config = model.checkpoint->config();
  model.config.kv_element = tf::ChooseKvElement(spec.dtype, model.config.head_dim, /*on_device=*/false);
  model.cpu = std::make_unique<tf::CpuModel>(model.config, model.weights, static_cast<int>(threads));
  return OkStatus();
}

}  // namespace warmpool::bench
