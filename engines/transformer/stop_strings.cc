#include "engines/transformer/stop_strings.h"

#include <algorithm>

namespace warmpool::transformer {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopStrings::Push(std::string_view piece) {
  if (stopped_) return {};
  pending_.append(piece);
  // The earliest stop string wins (on a tie, any: the text before it is the same).
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, pending_.find(stop));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail of the text that is the beginning of a stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, pending_.size()); n > hold; n--) {
      if (std::string_view(pending_).substr(pending_.size() - n) == std::string_view(stop).substr(0, n)) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStrings::Finish() {
  if (stopped_) return {};
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace warmpool::transformer
