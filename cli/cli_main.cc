// warmpool: the command-line client of warmpoold.
// Exit status: 0 on success, 1 when the daemon answered with an error, 2 on bad usage or input.
// Errors print one line: "error: CODE: message"; usage errors "warmpool: MESSAGE; see warmpool
// --help" (common/command_line.h). Both are told in --help (kFooter).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "common/command_line.h"

#include "common/paths.h"
#include "common/units.h"

#include "cli/cli_output.h"
#include "cli/embed_command.h"
#include "cli/generate_command.h"
#include "cli/tensors_command.h"
#include "client/client.h"
#include "client/ready.h"
#include "ipc/codes.h"
#include "top/top.h"

namespace {

using warmpool::Code;
using warmpool::Status;

int Fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return warmpool::ipc::CliExitOf(status.code());
}

void Print(const std::string& text) { std::fwrite(text.data(), 1, text.size(), stdout); }

warmpool::Result<std::string> ReadInput(const std::string& path) {
  std::stringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(path);
    if (!in) return warmpool::Error(Code::kInvalidArgument, "cannot read input file \"{}\"", path);
    text << in.rdbuf();
  }
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"warmpool: talk to the warmpool daemon (warmpoold)."};
  app.require_subcommand(1);
  app.footer(
      "Sizes: WEIGHTS (held once), WORKSPACE (every replica's), TOTAL (their sum: what a model holds of\n"
      "its device's budget); the same names in --json and the HTTP API (weight_bytes, workspace_bytes,\n"
      "total_bytes).\n"
      "Exit status: 0 done; 1 the daemon refused (stderr: \"error: CODE: message\"); 2 bad usage or input\n"
      "(stderr: \"warmpool[ COMMAND]: MESSAGE; see warmpool[ COMMAND] --help\", or \"error: INVALID_ARGUMENT: ...\").");
  std::string socket = warmpool::client::DefaultSocketPath();
  app.add_option("--socket", socket,
                 "daemon socket (env WARMPOOL_SOCKET; default $XDG_RUNTIME_DIR/warmpool.sock or "
                 "/tmp/warmpool-$UID.sock, else the service's " + std::string(warmpool::kSystemSocketPath) +
                     "; here " + socket + ")");

  bool json = false;
  auto* models = app.add_subcommand("models", "list every registered model");
  models->add_flag("--json", json, "print JSON");
  auto* ps = app.add_subcommand("ps", "list models loaded or loading");
  ps->add_flag("--json", json, "print JSON");
  auto* status = app.add_subcommand("status", "daemon, devices and workers");
  status->add_flag("--json", json, "print JSON");
  std::string wait;
  auto* wait_option = status->add_option(
      "--wait", wait,
      "first wait up to this long (e.g. 10s) for a daemon to answer: for scripts that start one; "
      "UNAVAILABLE (exit 1) when none does");
  bool workers_idle = false;
  status->add_flag("--workers-idle", workers_idle,
                   "with --wait: also until every worker is up and idle (the first request waits for none)")
      ->needs(wait_option);

  std::string model;
  std::string keep_alive;
  auto* load = app.add_subcommand("load", "load a model and wait until it is ready");
  load->add_option("MODEL", model, "model name")->required();
  load->add_option("--keep-alive", keep_alive,
                   "keep it warm this long after its last request (5m, 30s; 0 = release it as soon as its "
                   "requests end; -1 = until evicted)");
  uint32_t replicas = 0;
  load->add_option("--replicas", replicas, "workers serving it from one copy of its weights");
  std::string path, engine;
  bool remove = false;
  auto* reg = app.add_subcommand(
      "register", "add a model while the daemon runs (its file must lie under a model root)");
  reg->add_option("MODEL", model, "model name")->required();
  auto* reg_path = reg->add_option("PATH", path, "safetensors file (made absolute here)");
  reg->add_option("--engine", engine, "engine (default: the file's metadata, else dense)");
  reg->add_flag("--remove", remove, "forget a model registered this way, once its work ends")
      ->excludes(reg_path);
  auto* pin = app.add_subcommand("pin", "never evict or expire a model");
  pin->add_option("MODEL", model, "model name")->required();
  auto* unpin = app.add_subcommand("unpin", "let a pinned model be evicted again");
  unpin->add_option("MODEL", model, "model name")->required();
  auto* unload = app.add_subcommand("unload", "unload a model (after its requests finish)");
  bool park = false, all = false;
  auto* unload_model = unload->add_option("MODEL", model, "model name");
  unload->add_flag("--park", park, "keep a host copy so that the next load is a memory copy");
  auto* unload_all = unload->add_flag("--all", all, "every loaded model (parked where the park budget allows)");
  unload_all->excludes(unload_model);

  auto* infer = app.add_subcommand("infer", "run inference on a batch of rows");
  infer->add_option("MODEL", model, "model name")->required();
  std::string input_path;
  uint32_t random_rows = 0, cols = 0, deadline_ms = 0;
  uint64_t seed = 1;
  auto* input_opt = infer->add_option("--input", input_path, "JSON list of rows, from FILE or - (stdin)");
  auto* random_opt = infer->add_option("--random", random_rows, "BATCH rows of random input instead")
                         ->check(CLI::Range(1u, 1u << 20));
  input_opt->excludes(random_opt);
  std::string tensors_path;
  auto* tensors_opt = infer->add_option(
      "--tensors", tensors_path,
      "typed tensors from FILE or - (stdin), as KServe v2 JSON: {\"inputs\": [{\"name\", \"shape\", "
      "\"datatype\", \"data\"}]}; prints {\"outputs\": [...]}");
  tensors_opt->excludes(input_opt)->excludes(random_opt);
  infer->add_option("--cols", cols, "columns of --random input (default: the model's input width)");
  infer->add_option("--seed", seed, "seed of --random input");
  infer->add_option("--deadline-ms", deadline_ms, "give up after this many milliseconds");
  infer->add_flag("--json", json, "print the output rows as JSON");
  infer->add_option("--keep-alive", keep_alive,
                    "keep the model warm this long after this request (0: release it when it ends)");

  warmpool::cli::GenerateArgs generate_args;
  auto* generate = app.add_subcommand("generate", "text from a language model, streamed as it is generated");
  warmpool::cli::AddGenerateOptions(generate, generate_args, keep_alive);
  auto* run = app.add_subcommand(
      "run", "generate from a prompt, or (no prompt, on a terminal) from each line typed at \">>> \" until /bye");
  warmpool::cli::AddGenerateOptions(run, generate_args, keep_alive);

  warmpool::cli::EmbedArgs embed_args;
  auto* embed = app.add_subcommand("embed", "embeddings from a language model, one per text, at unit length");
  warmpool::cli::AddEmbedOptions(embed, embed_args, keep_alive);

  auto* fault = app.add_subcommand(
      "fault", "arm or clear injected faults (daemon started with --enable-fault-injection only)");
  fault->require_subcommand(1);
  std::string point, action;
  uint32_t after = 0, times = 0;
  auto* arm = fault->add_subcommand("arm", "arm a fault at a worker fault point");
  arm->add_option("POINT", point,
                  "load.begin, load.after_alloc, load.mid_copy, load.before_ready, "
                  "infer.after_take, infer.mid, infer.before_restore, unload.mid, attach.mid")
      ->required();
  arm->add_option("ACTION", action, "kill, segv, abort, hang, exit:N, delay:MS")->required();
  arm->add_option("--model", model, "only while working for this model");
  arm->add_option("--after", after, "fire on the Nth matching hit in a worker (default 1)");
  arm->add_option("--times", times, "disarm after firing this many times in all (default 1)");
  auto* clear = fault->add_subcommand("clear", "disarm every fault");

  warmpool::top::TopOptions top_options;
  bool once = false;
  auto* top = app.add_subcommand(
      "top", "a live view of the pool: memory, models, rates, latency, workers, events (q quits)");
  top->add_option("--interval", top_options.interval_seconds,
                  "seconds between refreshes (default 1)")
      ->check(CLI::Range(0.1, 3600.0));
  auto* iterations =
      top->add_option("--iterations", top_options.iterations,
                      "stop after N refreshes (default: until q; not on a terminal, forever)")
          ->check(CLI::Range(uint64_t{1}, UINT64_MAX));
  top->add_flag("--once", once, "one refresh (--iterations 1)")->excludes(iterations);

  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (top->parsed()) {
    // top makes its own connection, and maps the segment when it may.
    top_options.socket = socket;
    if (once) top_options.iterations = 1;
    return warmpool::top::RunTop(top_options);
  }

  std::optional<int64_t> keep_alive_ms;
  if (!keep_alive.empty()) {
    auto ms = warmpool::ParseDurationMs(keep_alive);
    if (!ms.ok()) return Fail(ms.status());
    keep_alive_ms = *ms;
  }
  int64_t wait_ms = 0;
  if (!wait.empty()) {
    auto ms = warmpool::ParseDurationMs(wait);
    if (!ms.ok()) return Fail(ms.status());
    wait_ms = *ms;
  }
  auto connected = wait.empty() ? warmpool::client::Client::Connect(socket)
                                : warmpool::client::ConnectWhenReady(socket, {wait_ms, workers_idle, {}});
  if (!connected.ok()) return Fail(connected.status());
  warmpool::client::Client& client = **connected;

  if (generate->parsed() || run->parsed()) {
    generate_args.keep_alive_ms = keep_alive_ms;
    return generate->parsed() ? warmpool::cli::RunGenerate(client, generate_args)
                              : warmpool::cli::RunInteractive(client, generate_args);
  }
  if (embed->parsed()) {
    embed_args.keep_alive_ms = keep_alive_ms;
    auto out = warmpool::cli::RunEmbed(client, embed_args);
    if (!out.ok()) return Fail(out.status());
    Print(*out);
    return 0;
  }
  if (models->parsed()) {
    auto reply = client.Models();
    if (!reply.ok()) return Fail(reply.status());
    Print(json ? warmpool::cli::ModelsJson(*reply).dump(2) + "\n" : warmpool::cli::ModelsTable(*reply));
  } else if (ps->parsed()) {
    auto reply = client.Ps();
    if (!reply.ok()) return Fail(reply.status());
    Print(json ? warmpool::cli::PsJson(*reply).dump(2) + "\n" : warmpool::cli::PsTable(*reply));
  } else if (status->parsed()) {
    auto reply = client.GetStatus();
    if (!reply.ok()) return Fail(reply.status());
    Print(json ? warmpool::cli::StatusJson(*reply).dump(2) + "\n" : warmpool::cli::StatusText(*reply));
  } else if (load->parsed()) {
    // A second connection polls `ps` meanwhile: a redrawn bar on a terminal, a line per second
    // otherwise (logs and scripts).
    std::atomic<bool> done{false};
    std::thread progress([&] {
      bool tty = isatty(STDERR_FILENO);
      auto watcher = warmpool::client::Client::Connect(socket);
      int ticks = 0;
      while (watcher.ok() && !done.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (done.load() || (!tty && ++ticks % 10 != 0)) continue;
        auto ps = (*watcher)->Ps();
        if (!ps.ok()) break;
        for (const auto& e : ps->models()) {
          if (e.name() != model || e.state() != "loading" || e.weight_bytes() == 0) continue;
          double part = static_cast<double>(e.loaded_bytes()) / e.weight_bytes();
          if (tty) {
            int filled = static_cast<int>(part * 30);
            std::fprintf(stderr, "\rloading %s [%s%s] %3.0f%% %s of %s ", model.c_str(),
                         std::string(filled, '#').c_str(), std::string(30 - filled, ' ').c_str(),
                         part * 100, warmpool::FormatBytes(e.loaded_bytes()).c_str(),
                         warmpool::FormatBytes(e.weight_bytes()).c_str());
          } else {
            std::fprintf(stderr, "loading %s: %.0f%% (%s of %s)\n", model.c_str(), part * 100,
                         warmpool::FormatBytes(e.loaded_bytes()).c_str(),
                         warmpool::FormatBytes(e.weight_bytes()).c_str());
          }
        }
      }
    });
    bool tty = isatty(STDERR_FILENO);
    warmpool::Result<warmpool::v1::LoadReply> reply =
        client.Load(model, warmpool::client::LoadOptions{replicas, keep_alive_ms});
    done = true;
    progress.join();
    if (tty) std::fprintf(stderr, "\r\033[K");
    if (!reply.ok()) return Fail(reply.status());
    Print(warmpool::cli::LoadText(*reply));
  } else if (reg->parsed()) {
    if (!remove && path.empty()) {
      return Fail(warmpool::Error(Code::kInvalidArgument, "register needs PATH (or --remove)"));
    }
    // The daemon has its own working directory: send the path absolute, symlinks unresolved
    // (the daemon resolves them against its model roots).
    auto reply = remove ? client.Unregister(model)
                        : client.Register(model, std::filesystem::absolute(path).lexically_normal().string(),
                                          engine);
    if (!reply.ok()) return Fail(reply.status());
    const auto& out = *reply;
    if (out.removed()) {
      Print(fmt::format("{} will be removed once its work ends\n", model));
    } else {
      Print(fmt::format("{} registered from {} ({:.1f} MiB of weights){}\n", model, out.path(),
                        out.weight_bytes() / 1048576.0,
                        out.replaced() ? "; the previous version goes once its work ends" : ""));
    }
  } else if (pin->parsed() || unpin->parsed()) {
    auto reply = client.Pin(model, pin->parsed());
    if (!reply.ok()) return Fail(reply.status());
    Print(fmt::format("{} {}\n", model, pin->parsed() ? "pinned" : "unpinned"));
  } else if (arm->parsed()) {
    auto reply = client.ArmFault(warmpool::client::FaultSpec{point, action, model, after, times});
    if (!reply.ok()) return Fail(reply.status());
    Print(fmt::format("fault {} armed\n", *reply));
  } else if (clear->parsed()) {
    auto reply = client.ClearFaults();
    if (!reply.ok()) return Fail(reply.status());
    Print(fmt::format("{} fault(s) cleared\n", *reply));
  } else if (unload->parsed()) {
    if (!all && model.empty()) {
      return Fail(warmpool::Error(Code::kInvalidArgument, "unload needs MODEL or --all"));
    }
    if (all) {
      auto reply = client.UnloadAll();
      if (!reply.ok()) return Fail(reply.status());
      Print(fmt::format("unloaded {}\n", reply->model()));
    } else {
      if (Status s = client.Unload(model, park); !s.ok()) return Fail(s);
      Print(fmt::format("{} {}\n", model, park ? "parked" : "unloaded"));
    }
  } else if (infer->parsed() && !tensors_path.empty()) {
    auto text = ReadInput(tensors_path);
    if (!text.ok()) return Fail(text.status());
    auto printed = warmpool::cli::RunInferTensors(client, model, *text,
                                                  warmpool::client::InferOptions{deadline_ms, keep_alive_ms});
    if (!printed.ok()) return Fail(printed.status());
    Print(*printed);
  } else if (infer->parsed()) {
    warmpool::client::Matrix input;
    if (random_rows > 0) {
      if (cols == 0) {
        auto list = client.Models();
        if (!list.ok()) return Fail(list.status());
        for (const auto& m : list->models()) {
          if (m.name() == model) cols = m.in_features();
        }
        if (cols == 0) cols = 8;  // a model that takes any width (echo), or unknown: pick one
      }
      std::mt19937_64 rng(seed);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      input.rows = random_rows;
      input.cols = cols;
      input.data.resize(uint64_t{random_rows} * cols);
      for (float& v : input.data) v = dist(rng);
    } else if (!input_path.empty()) {
      auto text = ReadInput(input_path);
      if (!text.ok()) return Fail(text.status());
      auto parsed = warmpool::cli::MatrixFromJson(*text);
      if (!parsed.ok()) return Fail(parsed.status());
      input = std::move(*parsed);
    } else {
      return Fail(warmpool::Error(Code::kInvalidArgument,
                                  "infer needs --input FILE (or - for stdin) or --random BATCH"));
    }
    auto output = client.Infer(model, input, warmpool::client::InferOptions{deadline_ms, keep_alive_ms});
    if (!output.ok()) return Fail(output.status());
    Print(json ? warmpool::cli::MatrixJson(*output).dump() + "\n" : warmpool::cli::MatrixText(*output));
  }
  return 0;
}
