// Text layout for `warmpool top`: tables that fit a terminal's width by dropping their least useful
// columns, bars, and the short forms of times, rates and latencies. Widths count code points (model
// names may be UTF-8), which is what a terminal shows for the scripts model names use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace warmpool::top {

struct Column {
  std::string title;
  bool right_aligned = false;  // numbers
  // 0: always shown. When a table is wider than the screen, the column with the highest number
  // goes first, then the next, until it fits.
  int drop_order = 0;
};

// The title row, then one line per row: cells padded to their column's widest, two spaces apart,
// the last column unpadded. Rows have one cell per column. width 0: no limit.
std::vector<std::string> LayoutTable(const std::vector<Column>& columns,
                                     const std::vector<std::vector<std::string>>& rows,
                                     size_t width);

size_t DisplayWidth(std::string_view text);
// At most width code points (0: unchanged), never cutting a UTF-8 sequence.
std::string Truncate(std::string_view text, size_t width);
// "[#####.........]" with cells inside the brackets; part is clamped to 0..1.
std::string Bar(double part, size_t cells);

std::string FormatDuration(uint64_t seconds);              // "12s", "3m 12s", "2h 05m", "3d 4h"
std::string FormatLatency(std::optional<double> seconds);  // "0.4ms", "12ms", "1.25s", "-"
std::string FormatRate(std::optional<double> per_second);  // "0", "0.5", "12.3", "840", "-"
std::string FormatPercent(std::optional<double> ratio);    // "0%", "0.5%", "12%", "-"
std::string FormatClock(uint64_t unix_ns);                 // local "HH:MM:SS"

}  // namespace warmpool::top
