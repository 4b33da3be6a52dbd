#include "top/top_text.h"

#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <cmath>

namespace warmpool::top {

namespace {

bool ContinuationByte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

std::string Pad(const std::string& cell, size_t width, bool right) {
  const size_t shown = DisplayWidth(cell);
  if (shown >= width) return cell;
  const std::string fill(width - shown, ' ');
  return right ? fill + cell : cell + fill;
}

std::vector<size_t> ColumnWidths(const std::vector<Column>& columns,
                                 const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const Column& c : columns) widths.push_back(DisplayWidth(c.title));
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size() && i < widths.size(); i++) {
      widths[i] = std::max(widths[i], DisplayWidth(row[i]));
    }
  }
  return widths;
}

size_t TableWidth(const std::vector<size_t>& widths, const std::vector<bool>& shown) {
  size_t total = 0, count = 0;
  for (size_t i = 0; i < widths.size(); i++) {
    if (!shown[i]) continue;
    total += widths[i];
    count++;
  }
  return total + (count > 0 ? 2 * (count - 1) : 0);
}

// The shown column that goes next on a narrow screen, or none when only undroppable ones remain.
std::optional<size_t> NextToDrop(const std::vector<Column>& columns,
                                 const std::vector<bool>& shown) {
  std::optional<size_t> next;
  for (size_t i = 0; i < columns.size(); i++) {
    if (!shown[i] || columns[i].drop_order == 0) continue;
    if (!next || columns[i].drop_order > columns[*next].drop_order) next = i;
  }
  return next;
}

std::string Line(const std::vector<std::string>& cells, const std::vector<Column>& columns,
                 const std::vector<size_t>& widths, const std::vector<bool>& shown) {
  size_t last = 0;
  for (size_t i = 0; i < shown.size(); i++) {
    if (shown[i]) last = i;
  }
  std::string line;
  for (size_t i = 0; i < columns.size(); i++) {
    if (!shown[i]) continue;
    const std::string& cell = i < cells.size() ? cells[i] : std::string();
    const bool pad = i != last || columns[i].right_aligned;
    line += pad ? Pad(cell, widths[i], columns[i].right_aligned) : cell;
    if (i != last) line += "  ";
  }
  line.erase(line.find_last_not_of(' ') + 1);  // an empty last cell leaves no trailing blanks
  return line;
}

}  // namespace

size_t DisplayWidth(std::string_view text) {
  return static_cast<size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return !ContinuationByte(c); }));
}

std::string Truncate(std::string_view text, size_t width) {
  if (width == 0) return std::string(text);
  size_t points = 0;
  for (size_t i = 0; i < text.size(); i++) {
    if (ContinuationByte(text[i])) continue;
    if (points++ == width) return std::string(text.substr(0, i));
  }
  return std::string(text);
}

std::vector<std::string> LayoutTable(const std::vector<Column>& columns,
                                     const std::vector<std::vector<std::string>>& rows,
                                     size_t width) {
  const std::vector<size_t> widths = ColumnWidths(columns, rows);
  std::vector<bool> shown(columns.size(), true);
  while (width != 0 && TableWidth(widths, shown) > width) {
    std::optional<size_t> drop = NextToDrop(columns, shown);
    if (!drop) break;
    shown[*drop] = false;
  }
  std::vector<std::string> titles;
  for (const Column& c : columns) titles.push_back(c.title);
  std::vector<std::string> lines{Truncate(Line(titles, columns, widths, shown), width)};
  for (const auto& row : rows) lines.push_back(Truncate(Line(row, columns, widths, shown), width));
  return lines;
}

std::string Bar(double part, size_t cells) {
  part = std::clamp(std::isfinite(part) ? part : 0.0, 0.0, 1.0);
  size_t filled = static_cast<size_t>(std::lround(part * static_cast<double>(cells)));
  // Anything in use shows as at least one cell: a small model on a large budget is not nothing.
  if (part > 0 && filled == 0) filled = 1;
  return "[" + std::string(filled, '#') + std::string(cells - filled, '.') + "]";
}

std::string FormatDuration(uint64_t seconds) {
  if (seconds < 60) return fmt::format("{}s", seconds);
  if (seconds < 3600) return fmt::format("{}m {:02}s", seconds / 60, seconds % 60);
  if (seconds < 86400) return fmt::format("{}h {:02}m", seconds / 3600, seconds / 60 % 60);
  return fmt::format("{}d {}h", seconds / 86400, seconds / 3600 % 24);
}

std::string FormatLatency(std::optional<double> seconds) {
  if (!seconds) return "-";
  const double ms = *seconds * 1000;
  if (ms < 10) return fmt::format("{:.1f}ms", ms);
  if (ms < 1000) return fmt::format("{:.0f}ms", ms);
  return fmt::format("{:.2f}s", *seconds);
}

std::string FormatRate(std::optional<double> per_second) {
  if (!per_second) return "-";
  if (*per_second == 0) return "0";
  if (*per_second < 100) return fmt::format("{:.1f}", *per_second);
  return fmt::format("{:.0f}", *per_second);
}

std::string FormatPercent(std::optional<double> ratio) {
  if (!ratio) return "-";
  const double percent = *ratio * 100;
  if (percent == 0) return "0%";
  if (percent < 10) return fmt::format("{:.1f}%", percent);
  return fmt::format("{:.0f}%", percent);
}

std::string FormatClock(uint64_t unix_ns) {
  const time_t seconds = static_cast<time_t>(unix_ns / 1000000000ull);
  tm local{};
  localtime_r(&seconds, &local);
  char text[16];
  strftime(text, sizeof(text), "%H:%M:%S", &local);
  return text;
}

}  // namespace warmpool::top
