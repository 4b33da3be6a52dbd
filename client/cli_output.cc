#include "client/cli_output.h"

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

}  // namespace

std::string ModelsTable(const v1::ModelsReply& reply) {
  std::vector<std::vector<std::string>> rows = {{"NAME", "ENGINE", "STATE", "SIZE", "PATH"}};
  for (const v1::ModelInfo& m : reply.models()) {
    std::string state = m.state();
    if (!m.last_error().empty()) state += " (" + m.last_error() + ")";
    rows.push_back({m.name(), m.engine(), state, FormatBytes(m.bytes()), m.path()});
  }
  return Table(rows);
}

std::string PsTable(const v1::PsReply& reply) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STATE", "DEVICE", "SIZE", "INFLIGHT", "REPLICAS", "LAST USED", "EXPIRES"}};
  for (const v1::PsEntry& e : reply.models()) {
    std::string state = e.state();
    if (e.state() == "loading" && e.bytes() > 0) {
      state += fmt::format(" {}%", e.loaded_bytes() * 100 / std::max<uint64_t>(1, e.bytes()));
    }
    if (!e.last_error().empty()) {
      state += fmt::format(" ({}; retry in {:.1f} s)", e.last_error(), e.retry_in_ms() / 1000.0);
    }
    rows.push_back({e.name(), state, std::to_string(e.device()), FormatBytes(e.bytes()),
                    std::to_string(e.inflight()), std::to_string(e.replicas()), Ago(e.last_used()),
                    e.has_expiry() ? fmt::format("{}s", e.expires_in()) : "never"});
  }
  return Table(rows);
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
      failed.push_back({m.name(), fmt::format("{:.1f} s", m.retry_in_ms() / 1000.0), m.last_error()});
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
