#include "supervisor/core/model_entry.h"

#include <cctype>

namespace warmpool::supervisor {

Status CheckModelName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 63 && name[0] != '.';
  for (char c : name) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  }
  if (!ok) {
    return Error(Code::kInvalidArgument,
                 "model name \"{}\" must be 1 to 63 characters of letters, digits, '.', '_' or '-' "
                 "and not start with '.'",
                 name);
  }
  return OkStatus();
}

}  // namespace warmpool::supervisor
