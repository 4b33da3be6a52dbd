#include "top/top_view.h"

#include <fmt/format.h>

#include <algorithm>

#include "top/top_text.h"
#include "common/units.h"
#include "shm/model_index.h"

namespace warmpool::top {

namespace {

using Lines = std::vector<std::string>;

size_t BarCells(size_t width) { return width == 0 ? 30 : std::clamp<size_t>(width / 4, 10, 40); }

std::string TitleLine(const Frame& frame, const ViewContext& context, size_t width) {
  std::string left = fmt::format("warmpool top  warmpoold {}  backend {}  instance {}",
                                 context.version, context.backend, context.instance);
  // While the daemon is gone (an alert says so) its uptime is not known.
  if (context.alert.empty() && frame.pool.stats && frame.pool.stats->started_unix_ns != 0 &&
      context.now_unix_ns >= frame.pool.stats->started_unix_ns) {
    left += "  up " + FormatDuration((context.now_unix_ns - frame.pool.stats->started_unix_ns) /
                                     1000000000ull);
  }
  const std::string right =
      fmt::format("every {:g}s  {}", context.refresh_seconds, FormatClock(context.now_unix_ns));
  const size_t used = DisplayWidth(left) + DisplayWidth(right);
  const size_t gap = width > used + 2 ? width - used : 2;
  return left + std::string(gap, ' ') + right;
}

std::string AccountLine(const std::string& label, uint64_t used, uint64_t budget, size_t width,
                        const std::string& unlimited) {
  if (budget == 0) return fmt::format("{:<10}{} ({})", label, FormatBytes(used), unlimited);
  const double part = static_cast<double>(used) / static_cast<double>(budget);
  return fmt::format("{:<10}{}  {} of {} ({:.0f}%)", label, Bar(part, BarCells(width)),
                     FormatBytes(used), FormatBytes(budget), part * 100);
}

std::string SummaryLine(const PoolSample& pool) {
  size_t up = 0;
  uint64_t restarts = 0;
  for (const WorkerSample& w : pool.workers) {
    up += w.state == "idle" || w.state == "busy";
    restarts += w.restarts;
  }
  std::string line = fmt::format("workers {}/{} up   in-flight {}   queued {}   worker restarts {}",
                                 up, pool.workers.size(), pool.inflight, pool.queued, restarts);
  if (pool.stats) {
    line += fmt::format(" ({} crashed, {} killed by the daemon)",
                        pool.stats->restarts[static_cast<uint32_t>(shm::RestartReason::kCrashed)],
                        pool.stats->restarts[static_cast<uint32_t>(shm::RestartReason::kKilled)]);
  }
  return line;
}

Lines Header(const Frame& frame, const ViewContext& context, size_t width) {
  Lines lines{TitleLine(frame, context, width)};
  if (!context.socket_reason.empty()) {
    lines.push_back("via the socket (no rates, latency or park account): " + context.socket_reason);
  }
  if (!context.alert.empty()) lines.push_back("!! " + context.alert);
  for (size_t d = 0; d < frame.pool.devices.size(); d++) {
    const DeviceSample& device = frame.pool.devices[d];
    lines.push_back(AccountLine(fmt::format("device {}", d), device.used_bytes, device.budget_bytes,
                                width, "no budget"));
  }
  if (frame.pool.park) {
    lines.push_back(frame.pool.park->budget_bytes == 0
                        ? "parked    off (no park budget)"
                        : AccountLine("parked", frame.pool.park->used_bytes,
                                      frame.pool.park->budget_bytes, width, ""));
  }
  lines.push_back(SummaryLine(frame.pool));
  return lines;
}

std::string StateCell(const ModelSample& m) {
  std::string state(shm::ModelStateName(m.state));
  if (m.state == shm::ModelState::kLoading && m.weight_bytes > 0) {
    state += fmt::format(" {}%", std::min<uint64_t>(100, m.loaded_bytes * 100 / m.weight_bytes));
  }
  return state;
}

Lines ModelTable(const Frame& frame, size_t width) {
  const bool rates = frame.pool.from_segment();
  std::vector<Column> columns = {{"MODEL"},          {"STATE"},         {"DEV", true, 7},
                                 {"TOTAL", true, 4}, {"REPL", true, 8}, {"PIN", false, 9},
                                 {"INFL", true, 3}};
  if (rates) {
    columns.insert(columns.end(),
                   {{"REQ/S", true, 1}, {"ERR", true, 5}, {"P50", true, 6}, {"P99", true, 2}});
  }
  const bool any_failed =
      std::any_of(frame.models.begin(), frame.models.end(),
                  [](const ModelRow& row) { return row.model.state == shm::ModelState::kFailed; });
  if (any_failed) columns.push_back({"ERROR", false, 10});
  std::vector<std::vector<std::string>> rows;
  for (const ModelRow& row : frame.models) {
    const ModelSample& m = row.model;
    std::vector<std::string> cells = {m.name,
                                      StateCell(m),
                                      std::to_string(m.device),
                                      FormatBytes(m.bytes),
                                      std::to_string(m.replicas),
                                      m.pinned ? "yes" : "-",
                                      std::to_string(m.inflight)};
    if (rates) {
      cells.insert(cells.end(),
                   {FormatRate(row.rates.requests_per_second), FormatPercent(row.rates.error_ratio),
                    FormatLatency(row.rates.p50_seconds), FormatLatency(row.rates.p99_seconds)});
    }
    if (any_failed) cells.push_back(m.state == shm::ModelState::kFailed ? m.error : "-");
    rows.push_back(std::move(cells));
  }
  Lines lines;
  if (rows.empty()) {
    lines.push_back("no model loaded");
  } else {
    lines = LayoutTable(columns, rows, width);
  }
  if (frame.idle_registered > 0) {
    lines.push_back(fmt::format("(and {} registered model{} not loaded)", frame.idle_registered,
                                frame.idle_registered == 1 ? "" : "s"));
  }
  return lines;
}

std::string Joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
  return out.empty() ? "-" : out;
}

Lines WorkerTable(const PoolSample& pool, size_t width) {
  const std::vector<Column> columns = {
      {"WORKER", true},    {"PID", true},           {"STATE"},
      {"DEV", true, 5},    {"RESTARTS", true, 3},   {"OUTST", true, 2},
      {"SERVED", true, 4}, {"LAST EXIT", false, 6}, {"MODELS", false, 7}};
  std::vector<std::vector<std::string>> rows;
  for (const WorkerSample& w : pool.workers) {
    rows.push_back({std::to_string(w.slot), std::to_string(w.pid), w.state,
                    std::to_string(w.device), std::to_string(w.restarts),
                    std::to_string(w.outstanding), w.served ? std::to_string(*w.served) : "-",
                    w.last_exit.empty() ? "-" : w.last_exit, Joined(w.models)});
  }
  if (rows.empty()) return {"no worker running"};
  return LayoutTable(columns, rows, width);
}

Lines EventLines(const Frame& frame) {
  Lines lines{"recent events"};
  for (const Event& e : frame.events) lines.push_back(FormatClock(e.unix_ns) + "  " + e.text);
  if (frame.events.empty()) lines.push_back("  none since top started");
  return lines;
}

void Append(Lines& to, const Lines& from) { to.insert(to.end(), from.begin(), from.end()); }

// The model table loses rows from its end (the idlest) until the screen fits; at least the title
// row and one model stay, and a line says how many are hidden.
Lines FitModels(Lines models, size_t room) {
  if (models.size() <= room) return models;
  const size_t keep = std::max<size_t>(2, room > 0 ? room - 1 : 0);
  if (keep >= models.size()) return models;
  const size_t hidden = models.size() - keep;
  models.resize(keep);
  models.push_back(fmt::format("... {} more line{} (a taller window shows them)", hidden,
                               hidden == 1 ? "" : "s"));
  return models;
}

}  // namespace

std::vector<std::string> RenderFrame(const Frame& frame, const ViewContext& context, size_t width,
                                     size_t height) {
  Lines head = Header(frame, context, width);
  head.push_back("");
  Lines tail{""};
  Append(tail, WorkerTable(frame.pool, width));
  tail.push_back("");
  Append(tail, EventLines(frame));
  Lines models = ModelTable(frame, width);
  if (height != 0) {
    const size_t fixed = head.size() + tail.size();
    models = FitModels(std::move(models), height > fixed ? height - fixed : 0);
  }
  Lines screen = std::move(head);
  Append(screen, models);
  Append(screen, tail);
  if (height != 0 && screen.size() > height) screen.resize(height);
  for (std::string& line : screen) line = Truncate(line, width);
  return screen;
}

}  // namespace warmpool::top
