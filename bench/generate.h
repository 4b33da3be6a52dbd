// warmpool-bench --generate: the transformer engine's CPU forward pass, in-process (no daemon, no
// tokenizer), on a random-initialised Llama-shaped checkpoint of about --model-mib MiB of weights
// (hidden 1024, MLP 2816, 16 heads and 4 key/value heads, a 32000-token vocabulary; as many layers
// as the size allows). Per round, interleaved: the read bandwidth of this machine, measured by
// summing a buffer as large as the weights with the engine's thread count (the limit of a decode
// step, which reads every weight once), a prefill of --prompt tokens, and --tokens greedy decode
// steps. Reports decode tokens/s, the weight bytes those steps read per second, and that as a
// fraction of the measured bandwidth (the goal: at least 0.8); prefill tokens/s. Then, on
// the same checkpoint, PyTorch's decode and prefill (bench/torch_llama.py, installed beside the
// binary; in the same dtype, in a child process after the engine's rounds) and the engine's ratio
// to them (the goal: decode at least 1.5x PyTorch's in bf16). With --batch N, each round also
// prefills N sequences and times --tokens steps of all N together (CpuModel::Step). Like the
// other modes it asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct GenerateOptions {
  uint32_t model_mib = 256;
  std::string dtype = "bf16";  // f32, f16 or bf16: the weights as stored
  // The KV cache's element: "auto" (the engine's choice, ChooseKvElement), "f32" or "bf16".
  std::string kv_cache = "auto";
  uint32_t threads = 1;
  uint32_t prompt = 128;  // prefill tokens
  uint32_t tokens = 32;   // decode steps
  uint32_t rounds = 3;
  // Sequences stepped together (CpuModel::Step, continuous batching): their aggregate decode
  // tokens/s against batch 1's, in the same rounds (the goal of issue 28: at least 5x with 8).
  // 0 or 1: not measured.
  uint32_t batch = 8;
  bool json = false;
  std::string torch_python = "/usr/bin/python3";  // empty: no PyTorch baseline
};

// Runs the whole mode; returns the process exit status (0, or 1 after printing an error).
int RunGenerate(const GenerateOptions& options);

}  // namespace warmpool::bench
