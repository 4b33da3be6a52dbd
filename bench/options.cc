#include "bench/options.h"

namespace warmpool::bench {

void AddOptions(CLI::App& app, Options& options) {
  app.add_option("--daemon", options.daemon,
                 "warmpoold binary (default: warmpoold next to warmpool-bench)");
  app.add_option("--requests", options.requests,
                 "measured requests per path, in total over all clients")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "warm-up requests per path, not measured")
      ->capture_default_str();
  app.add_option("--payload", options.payload,
                 "input tensor bytes (f32, 1 row, payload/4 columns)")
      ->capture_default_str();
  app.add_option("--clients", options.clients,
                 "concurrent closed-loop clients, one thread and one connection each")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--pipeline", options.pipeline,
                 "requests each client keeps in flight (1: one at a time); both paths alike")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--rounds", options.rounds,
                 "measured rounds, alternating relay and warmpool (ABBA)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--backend", options.backend, "warmpoold --backend: host, cuda or auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "host", "cuda"}));
  app.add_flag("--json", options.json, "print one JSON object instead of the table");
  app.add_flag("--recovery", options.recovery,
               "instead: recovery after SIGKILL of a busy worker serving a dense model, against a "
               "warm load from the page cache (see bench/recovery.h)");
  app.add_flag("--sharing", options.sharing,
               "instead: supervisor-held weights: cold load vs cat, replica attach time, PSS of "
               "4 replicas and unpark vs memcpy, per model size (see bench/sharing.h)");
  app.add_option("--sizes-mib", options.sizes_mib, "--sharing: model sizes, MiB of f32 weights")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--poll-us", options.poll_us,
                 "--sharing: sleep between two ps polls while waiting for a replica")
      ->capture_default_str();
  app.add_option("--features", options.features,
                 "--sharing: input and output width of the generated MLPs (0: square, in = out ~ "
                 "hidden; the per-replica workspace grows with the hidden width)")
      ->capture_default_str();
  app.add_option("--iterations", options.iterations,
                 "--recovery: kills (and baseline loads); --sharing: cat + load pairs, attach "
                 "sequences and unparks per size (default 10 there)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--model-mib", options.model_mib, "--recovery, --restart, --switch: MiB of f32 weights in each model; --generate: MiB of weights")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--inflight", options.inflight,
                 "--recovery: requests pipelined on the worker when it is killed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rows", options.rows, "--recovery: rows of each of those requests")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--replicas", options.replicas,
                 "--recovery: replicas of the model (1 or 2); --second-turn: replicas, with another stream "
                 "running beside the second turn")
      ->capture_default_str()
      ->check(CLI::Range(1, 2));
  app.add_flag("--abuse", options.abuse,
               "instead: the daemon's memory under clients that pipeline large inputs and never "
               "read their replies, with the default limits and with them raised (see "
               "bench/abuse.h)");
  app.add_option("--greedy", options.greedy, "--abuse: greedy clients")->capture_default_str();
  app.add_option("--payload-mib", options.payload_mib, "--abuse: MiB of each greedy request; --regions: MiB per request (16)")
      ->capture_default_str();
  app.add_option("--seconds", options.seconds, "--abuse: how long the greedy clients push")
      ->capture_default_str();
  app.add_flag("--compute", options.compute,
               "instead: the dense engine's arithmetic in-process, f32/f16/bf16 weights, against "
               "OpenBLAS on the f32 weights as numpy calls it (see bench/compute.h)");
  app.add_option("--layers", options.layers, "--compute: layer widths, in,hidden...,out")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batches", options.batches, "--compute: rows per call, one measurement each")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", options.threads, "--compute, --generate: threads of the engine (and OpenBLAS and PyTorch)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--torch-python", options.torch_python,
                 "--compute, --generate: Python with PyTorch for the baseline (empty: none; without "
                 "PyTorch it is left out, saying why)")
      ->capture_default_str();
  app.add_flag("--generate", options.generate,
               "the transformer engine on the CPU, in-process: decode tokens/s against the read bandwidth "
               "measured in the same run, and prefill (see bench/generate.h)");
  app.add_option("--dtype", options.dtype, "--generate: f32, f16 or bf16 weights")->capture_default_str();
  app.add_option("--kv-cache", options.kv_cache,
                 "--generate in-process: the KV cache's element, auto (the engine's choice: bf16 for bf16 weights "
                 "where the CPU has AVX-512 BF16), f32 or bf16")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
  app.add_flag("--parked", options.parked,
               "--generate: through a daemon, a parked model's time to first token against unpark + prefill "
               "(bench/parked_generate.h; run from the repository root: it takes the demo model's tokenizer)");
  app.add_flag("--http", options.http,
               "--generate: through a daemon, tokens/s and time to first token of a stream through the "
               "OpenAI-compatible SSE endpoint against the framed protocol (bench/http_generate.h; run from "
               "the repository root)");
  app.add_option("--streams", options.streams,
                 "--generate: through a daemon, this many greedy streams at once against one alone, and a "
                 "stream's inter-token latency beside a --long-prompt prefill (continuous batching; "
                 "bench/stream_generate.h; run from the repository root)");
  app.add_option("--kv-cache-tokens", options.kv_cache_tokens,
                 "--generate --streams: [[models]] kv_cache_tokens, the positions the model's KV cache holds "
                 "for all its streams (0: a whole context each)")
      ->capture_default_str();
  app.add_option("--prefill-stretch", options.prefill_stretch,
                 "--generate --streams: [[models]] prefill_stretch, the decode steps a step carrying a prompt's "
                 "piece beside the streams may take (0: the engine's default, 2)")
      ->capture_default_str();
  app.add_flag("--resume", options.resume,
               "--generate: through a daemon, a stream whose worker is SIGKILLed halfway: the gap to its next "
               "token against its median (bench/resume_generate.h; run from the repository root)");
  app.add_flag("--pieces", options.pieces,
               "--generate: what a prompt's piece of 1 to 64 tokens costs a step beside a decode row, at position "
               "0 and at --prompt (default 2000), in-process, against the decode step alone (bench/piece_cost.h)");
  app.add_flag("--embeddings", options.embeddings,
               "--generate: embeddings of --batch inputs (default 64 here) of --tokens tokens (default 16 here), "
               "in-process, in groups against one at a time (bench/embed_cost.h)");
  app.add_flag("--attention", options.attention,
               "--generate: decode attention alone, in-process: --batch sequences' rows over --prompt positions "
               "each, every layer of the --streams model, against reading the same keys and values "
               "(bench/decode_attention.h)");
  app.add_flag("--second-turn", options.second_turn,
               "--generate: through a daemon, a chat's second turn's time to first token against its first's "
               "after a --long-prompt history (the prefix cache; bench/second_turn.h; run from the repository root)");
  app.add_option("--tokenizer-dir", options.tokenizer_dir,
                 "--generate through a daemon: the model directory whose tokenizer.json and tokenizer_config.json the "
                 "bench's model takes")
      ->capture_default_str();
  app.add_option("--long-prompt", options.long_prompt,
                 "--generate --streams: the prompt prefilled beside a stream; --second-turn: the history")
      ->capture_default_str();
  app.add_option("--prompt", options.prompt, "--generate: prefill tokens")->capture_default_str();
  app.add_option("--tokens", options.tokens, "--generate: decode steps")->capture_default_str();
  app.add_option("--batch", options.batch,
                 "--generate: also step this many sequences together (continuous batching), against batch 1 "
                 "(0 or 1: not measured)")
      ->capture_default_str();
  app.add_flag("--batching", options.batching,
               "instead: dynamic batching: --clients clients x 1 row on a dense model, batched against "
               "batching off and against the engine in-process on as many rows per call (see "
               "bench/batching.h; --clients defaults to 16 there, --requests is per round)");
  app.add_option("--delay-us", options.delay_us, "--batching: [pool] max_batch_delay_us of the batched model")
      ->capture_default_str();
  app.add_flag("--regions", options.regions,
               "instead: large tensors through a client's shared-memory region: a --payload-mib "
               "(default 16) echo round trip against copying the bytes in and out once (memcpy), "
               "with the request alone and through frames beside it (see bench/regions.h)");
  app.add_flag("--restart", options.restart,
               "instead: a restart of warmpoold with a warm --model-mib model (default 1024): from the new "
               "daemon's start to the model ready and to its first inference, with the descriptor store "
               "(weights kept) and without it (a load from the page cache) (see bench/restart.h)");
  app.add_flag("--switch", options.switch_models,
               "instead: two --model-mib models (default 512) under a budget of one, requested in turn: "
               "each request evicts the other and loads its own, against `cat` of the file (see "
               "bench/switch.h)");
  app.get_option("--switch")->excludes("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse")->excludes("--batching")->excludes("--regions")->excludes("--restart");
  app.get_option("--restart")->excludes("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse")->excludes("--batching")->excludes("--regions");
  app.get_option("--regions")->excludes("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse")->excludes("--batching");
  app.get_option("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse");
  app.get_option("--generate")->excludes("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse")->excludes("--batching")->excludes("--regions")->excludes("--restart")->excludes("--switch");
  app.get_option("--batching")->excludes("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse");
  app.get_option("--recovery")->excludes("--sharing");
  app.get_option("--abuse")->excludes("--sharing")->excludes("--recovery");
}

}  // namespace warmpool::bench
