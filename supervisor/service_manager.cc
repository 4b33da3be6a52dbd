#include "supervisor/service_manager.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

namespace warmpool::supervisor {

ServiceManager::ServiceManager(uv_loop_t* loop) : loop_(loop) {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  notifying_ = socket != nullptr && socket[0] != '\0';
}

ServiceManager::~ServiceManager() { Close(); }

void ServiceManager::Notify(const std::string& state) {
  if (!notifying_) return;
  // unset_environment=0: later notifications need NOTIFY_SOCKET too.
  int rc = sd_notify(0, state.c_str());
  if (rc < 0) spdlog::warn("sd_notify({}): {}", state.substr(0, state.find('\n')), std::strerror(-rc));
}

void ServiceManager::StartWatchdog() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return;
  // Twice per interval, as sd_watchdog_enabled(3) recommends: one late ping is not a restart.
  uint64_t period_ms = std::max<uint64_t>(1, usec / 2000);
  uv_timer_init(loop_, watchdog_timer_.get());
  watchdog_timer_.MarkInitialized();
  watchdog_timer_.get()->data = this;
  uv_timer_start(watchdog_timer_.get(), [](uv_timer_t* t) {
    static_cast<ServiceManager*>(t->data)->Notify("WATCHDOG=1");
  }, 0, period_ms);
  spdlog::info("watchdog: pinging systemd every {} ms", period_ms);
}

void ServiceManager::Ready(const std::string& status) {
  last_status_ = status;
  Notify("READY=1\nSTATUS=" + status);
}

void ServiceManager::Reloading() { Notify("RELOADING=1"); }

void ServiceManager::Stopping(const std::string& status) {
  last_status_ = status;
  Notify("STOPPING=1\nSTATUS=" + status);
}

void ServiceManager::Status(const std::string& status) {
  if (status == last_status_) return;
  last_status_ = status;
  Notify("STATUS=" + status);
}

void ServiceManager::Close() {
  if (watchdog_timer_.active()) uv_timer_stop(watchdog_timer_.get());
  watchdog_timer_.Close();
}

}  // namespace warmpool::supervisor
