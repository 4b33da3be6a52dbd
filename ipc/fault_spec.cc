#include "ipc/fault_spec.h"

#include <charconv>
#include <string>

namespace warmpool::ipc {

bool ParseFaultNumber(std::string_view text, uint32_t& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

Status CheckFaultPoint(std::string_view point) {
  for (const char* p : kFaultPoints) {
    if (point == p) return OkStatus();
  }
  std::string known;
  for (const char* p : kFaultPoints) known += std::string(known.empty() ? "" : ", ") + p;
  return Error(Code::kInvalidArgument, "unknown fault point \"{}\" (known: {})", point, known);
}

Status CheckFaultAction(std::string_view action) {
  uint32_t n = 0;
  if (action == "kill" || action == "segv" || action == "abort" || action == "hang") return OkStatus();
  if (action.starts_with("exit:") && ParseFaultNumber(action.substr(5), n) && n < 256) return OkStatus();
  if (action.starts_with("delay:") && ParseFaultNumber(action.substr(6), n)) return OkStatus();
  return Error(Code::kInvalidArgument,
               "unknown fault action \"{}\" (kill, segv, abort, hang, exit:N, delay:MS)", action);
}

}  // namespace warmpool::ipc
