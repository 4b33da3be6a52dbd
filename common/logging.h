// Logging setup shared by warmpoold and its workers: spdlog to stderr. When stderr is the systemd
// journal (JOURNAL_STREAM names stderr's device and inode), every line starts with a syslog
// priority prefix such as "<3>" and leaves out the timestamp the journal adds itself.
#pragma once

#include <string>

namespace warmpool {

// How much a line matters, in the words of the code that decides it (the core's action::Log).
enum class LogLevel { kDebug, kInfo, kWarn, kError, kCritical };
// Logs `text` at `level` through the default logger.
void Log(LogLevel level, const std::string& text);

// True when stderr is connected to the journal.
bool StderrIsJournal();
// Installs the default logger named `name`; `tag` is printed in each line (e.g. "worker[1]").
void SetupLogging(const std::string& name, const std::string& tag, const std::string& level);

}  // namespace warmpool
