// What warmpoold tells systemd and takes from it (sd-daemon(3)), all of it optional: without
// NOTIFY_SOCKET every call is a no-op, without LISTEN_FDS the daemon binds its own socket.
//
// Readiness (READY=1) follows preload; STATUS= lines are sent only when their text changes; the
// watchdog is pinged from a timer on the event loop, so a loop that stops turning stops the pings
// and systemd restarts the service. Workers never see NOTIFY_SOCKET or LISTEN_* (worker_pool.cc
// leaves them out of the workers' environment), so only the supervisor speaks for the service.
#pragma once

#include <cstdint>
#include <string>

#include <uv.h>

#include "common/status.h"
#include "ipc/uv_handle.h"

namespace warmpool::supervisor {

class ServiceManager {
 public:
  explicit ServiceManager(uv_loop_t* loop);
  ~ServiceManager();
  ServiceManager(const ServiceManager&) = delete;
  ServiceManager& operator=(const ServiceManager&) = delete;

  bool notifying() const { return notifying_; }
  // Starts the watchdog pings when systemd asked for them (WatchdogSec=).
  void StartWatchdog();
  void Ready(const std::string& status);
  void Reloading();
  void Stopping(const std::string& status);
  // Sends the text as STATUS= when it differs from the last one sent.
  void Status(const std::string& status);
  void Close();

 private:
  void Notify(const std::string& state);

  bool notifying_ = false;
  uv_loop_t* loop_;
  ipc::UvHandle<uv_timer_t> watchdog_timer_;
  std::string last_status_;
};

}  // namespace warmpool::supervisor
