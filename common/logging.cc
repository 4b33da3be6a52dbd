#include "common/logging.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace warmpool {

namespace {

// "%*": the syslog priority of the message's level (sd-daemon(3) prefixes).
class PriorityFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    int priority = 6;  // LOG_INFO
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug: priority = 7; break;
      case spdlog::level::info: priority = 6; break;
      case spdlog::level::warn: priority = 4; break;
      case spdlog::level::err: priority = 3; break;
      case spdlog::level::critical: priority = 2; break;
      default: break;
    }
    const char text[3] = {'<', static_cast<char>('0' + priority), '>'};
    dest.append(text, text + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<PriorityFlag>();
  }
};

}  // namespace

bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(stream, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st{};
  if (fstat(2, &st) != 0) return false;
  return st.st_dev == dev && st.st_ino == ino;
}

void SetupLogging(const std::string& name, const std::string& tag, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(name);
  if (StderrIsJournal()) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<PriorityFlag>('*').set_pattern("%*" + tag + ": %v");
    logger->set_formatter(std::move(formatter));
  } else {
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e " + tag + " %^%l%$ %v");
  }
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
}

void Log(LogLevel level, const std::string& text) {
  switch (level) {
    case LogLevel::kDebug: return spdlog::debug("{}", text);
    case LogLevel::kInfo: return spdlog::info("{}", text);
    case LogLevel::kWarn: return spdlog::warn("{}", text);
    case LogLevel::kError: return spdlog::error("{}", text);
    case LogLevel::kCritical: return spdlog::critical("{}", text);
  }
}

}  // namespace warmpool
