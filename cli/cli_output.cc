#include "cli/cli_output.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "common/units.h"

namespace warmpool::cli {

using nlohmann::json;

namespace {

// Columns padded to their widest cell; the last column is not padded.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t i = 0; i < row.size(); i++) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); i++) {
      out += row[i];
      if (i + 1 < row.size()) out += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += '\n';
  }
  return out;
}

std::string Ago(int64_t unix_seconds) {
  if (unix_seconds == 0) return "never";
  int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  int64_t d = std::max<int64_t>(0, now - unix_seconds);
  if (d < 60) return fmt::format("{}s ago", d);
  if (d < 3600) return fmt::format("{}m ago", d / 60);
  return fmt::format("{}h ago", d / 3600);
}

// Why a model is failed or refused, and what comes next: a countdown to the next retry, or what
// to do when retrying cannot help (a broken file).
std::string Reason(const std::string& name, const std::string& error, int64_t retry_in_ms,
                   bool file_broken) {
  if (error.empty()) return "-";
  if (file_broken) return fmt::format("{}; fix the file, then 'warmpool load {}'", error, name);
  if (retry_in_ms > 0) return fmt::format("{}; retry in {:.1f} s", error, retry_in_ms / 1000.0);
  return error;
}

// The three sizes, named the same in every table and document: WEIGHTS, WORKSPACE (every
// replica's), TOTAL (what the model holds of its device's budget).
void AddSizes(std::vector<std::string>& row, uint64_t weights, uint64_t workspace) {
  row.push_back(FormatBytes(weights));
  row.push_back(FormatBytes(workspace));
  row.push_back(FormatBytes(weights + workspace));
}

}  // namespace

// Reasons go in the last column, after everything that aligns: they are long.
std::string ModelsTable(const v1::ModelsReply& reply) {
  bool any_reason = false;
  for (const v1::ModelInfo& m : reply.models()) any_reason = any_reason || !m.last_error().empty();
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "ENGINE", "STATE", "WEIGHTS", "WORKSPACE", "TOTAL", "PIN", "PATH"}};
  if (any_reason) rows[0].push_back("REASON");
  for (const v1::ModelInfo& m : reply.models()) {
    // A language model that cannot generate says so where a user looks for what it is.
    std::string engine = m.engine().empty() ? "-" : m.engine();
    if (m.embeds_only()) engine += " (embeds only)";
    std::vector<std::string> row = {m.name(), engine, m.state()};
    AddSizes(row, m.weight_bytes(), m.workspace_bytes());
    row.push_back(m.pinned() ? "yes" : "-");
    row.push_back(m.path().empty() ? "-" : m.path());
    if (any_reason) row.push_back(Reason(m.name(), m.last_error(), m.retry_in_ms(), m.file_broken()));
    rows.push_back(std::move(row));
  }
  return Table(rows);
}

std::string PsTable(const v1::PsReply& reply) {
  bool any_reason = false, any_prompts = false;
  for (const v1::PsEntry& e : reply.models()) {
    any_reason = any_reason || !e.last_error().empty();
    any_prompts = any_prompts || e.prompt_tokens() > 0;
  }
  std::vector<std::vector<std::string>> rows = {{"NAME", "STATE", "DEVICE", "WEIGHTS", "WORKSPACE", "TOTAL",
                                                 "INFLIGHT", "REPLICAS", "PIN", "LAST USED", "EXPIRES"}};
  if (any_prompts) rows[0].push_back("PREFIX HITS");
  if (any_reason) rows[0].push_back("REASON");
  for (const v1::PsEntry& e : reply.models()) {
    std::string state = e.state();
    if (e.state() == "loading" && e.weight_bytes() > 0) {
      state += fmt::format(" {}%", std::min<uint64_t>(100, e.loaded_bytes() * 100 / e.weight_bytes()));
    }
    // A pinned model never expires; only a ready one counts down.
    std::string expires = e.state() != "ready" ? "-"
                          : e.pinned()         ? "never (pinned)"
                          : e.has_expiry()     ? fmt::format("{}s", e.expires_in())
                                               : "never";
    std::vector<std::string> row = {e.name(), state, std::to_string(e.device())};
    AddSizes(row, e.weight_bytes(), e.workspace_bytes());
    row.insert(row.end(), {std::to_string(e.inflight()), std::to_string(e.replicas()), e.pinned() ? "yes" : "-",
                           Ago(e.last_used()), expires});
    // Of a language model's prompt tokens, the share found in its prefix cache.
    if (any_prompts) {
      row.push_back(e.prompt_tokens() == 0 ? "-"
                                           : fmt::format("{}%", e.cached_prompt_tokens() * 100 / e.prompt_tokens()));
    }
    if (any_reason) row.push_back(Reason(e.name(), e.last_error(), e.retry_in_ms(), e.file_broken()));
    rows.push_back(std::move(row));
  }
  return Table(rows);
}

std::string LoadText(const v1::LoadReply& r) {
  const std::string sizes = fmt::format("{} weights + {} workspace = {} total", FormatBytes(r.weight_bytes()),
                                        FormatBytes(r.workspace_bytes()),
                                        FormatBytes(r.weight_bytes() + r.workspace_bytes()));
  auto replicas = [](uint32_t n) { return fmt::format("{} replica{}", n, n == 1 ? "" : "s"); };
  std::string out;
  if (!r.already_loaded()) {
    out = fmt::format("{} ready in {} ms: {}; {}\n", r.model(), r.load_ms(), replicas(r.replicas()), sizes);
  } else if (r.replicas() != r.replicas_before()) {
    out = fmt::format("{} was already loaded: {} now, was {} ({})\n", r.model(), replicas(r.replicas()),
                      r.replicas_before(), sizes);
  } else {
    out = fmt::format("{} is already loaded: {}; {}\n", r.model(), replicas(r.replicas()), sizes);
  }
  if (!r.replicas_capped().empty()) {
    out += fmt::format("replicas: {} of {} asked for: {}\n", r.replicas(), r.replicas_asked(), r.replicas_capped());
  }
  if (r.evicted_size() > 0) {
    std::string names;
    for (const std::string& n : r.evicted()) names += (names.empty() ? "" : ", ") + n;
    out += fmt::format("evicted to make room: {}\n", names);
  }
  return out;
}

std::string StatusText(const v1::StatusReply& reply) {
  std::string out = fmt::format("warmpoold {}  backend {}  inflight {}  queued {}\n",
                                reply.version(), reply.backend(), reply.inflight(), reply.queued());
  std::vector<std::vector<std::string>> devices = {{"DEVICE", "KIND", "USED", "KEPT", "BUDGET", "TOTAL", "NAME"}};
  for (const v1::DeviceStatus& d : reply.devices()) {
    devices.push_back({std::to_string(d.id()), d.kind(), FormatBytes(d.used_bytes()), FormatBytes(d.kept_bytes()),
                       FormatBytes(d.budget_bytes()), d.total_bytes() != 0 ? FormatBytes(d.total_bytes()) : "-",
                       d.name().empty() ? "-" : d.name()});
  }
  std::vector<std::vector<std::string>> workers = {
      {"WORKER", "PID", "DEVICE", "STATE", "JOBS", "MODELS", "RESTARTS", "LAST EXIT"}};
  for (const v1::WorkerStatus& w : reply.workers()) {
    std::string models;
    for (const std::string& m : w.models()) models += (models.empty() ? "" : ",") + m;
    workers.push_back({std::to_string(w.slot()), std::to_string(w.pid()), std::to_string(w.device()),
                       w.state(), std::to_string(w.outstanding()), models.empty() ? "-" : models,
                       std::to_string(w.restarts()), w.last_exit()});
  }
  out += "\n" + Table(devices) + "\n" + Table(workers);
  if (reply.failed_size() > 0) {
    std::vector<std::vector<std::string>> failed = {{"FAILED", "RETRY IN", "REASON"}};
    for (const v1::ModelInfo& m : reply.failed()) {
      failed.push_back({m.name(), m.file_broken() ? "-" : fmt::format("{:.1f} s", m.retry_in_ms() / 1000.0),
                        Reason(m.name(), m.last_error(), 0, m.file_broken())});
    }
    out += "\n" + Table(failed);
  }
  for (const v1::PsEntry& e : reply.loading()) {
    out += fmt::format("\nloading {}: {} of {}", e.name(), FormatBytes(e.loaded_bytes()),
                       FormatBytes(e.weight_bytes()));
  }
  if (reply.loading_size() > 0) out += "\n";
  if (reply.fault_injection()) out += "\nfault injection is ENABLED\n";
  return out;
}

std::string MatrixText(const client::Matrix& m) {
  std::string out;
  for (uint32_t r = 0; r < m.rows; r++) {
    for (uint32_t c = 0; c < m.cols; c++) {
      out += fmt::format("{}{:.6g}", c == 0 ? "" : " ", m.data[uint64_t{r} * m.cols + c]);
    }
    out += '\n';
  }
  return out;
}

}  // namespace warmpool::cli
