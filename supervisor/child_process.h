// How the supervisor starts its helper processes (workers, device owners): fork+exec through
// libuv, the channel on descriptor 3, stdout and stderr shared with the supervisor, stdin closed,
// and none of the service manager's variables in the environment (only the supervisor talks to
// systemd: a child that saw NOTIFY_SOCKET could report readiness for it).
//
// ChildWithChannel is the one copy of "a child process with a channel" that WorkerPool and
// DeviceOwners are built on. A child's death is learnt from the kernel (libuv's SIGCHLD handling
// reports the exit), never by polling; an EOF on the channel alone gets the process SIGKILLed, so
// that the exit follows at once and there is one way a child ends.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <uv.h>

#include "ipc/connection.h"
#include "ipc/uv_handle.h"

namespace warmpool::supervisor {

// This process's environment less the service manager's variables, null-terminated for exec.
std::vector<char*> ChildEnvironment();

// How a child ended, as its owner reports it.
struct ChildEnd {
  std::string why;    // "killed by signal 9 (Killed)", "exited with status 1", or the kill's reason
  std::string plain;  // the same without the kill's reason: what the kernel said
  int exit_code = 0;  // the status, or 128 + signal
  bool fatal = false;  // exit status kChildFatal (ipc/exit_status.h): starting it again cannot help
};

// A failed start: errno or libuv's error, and whether trying again can help (a binary missing or
// not executable cannot start later either).
struct StartFailure {
  std::string why;
  bool hopeless = false;
};

class ChildWithChannel {
 public:
  struct Callbacks {
    std::function<void(std::string_view body)> on_frame;
    // The channel closed without being asked to while the process runs (it closed descriptor 3,
    // or the channel broke): the child is SIGKILLed right after, and on_exit follows.
    std::function<void(const Status& why)> on_channel_lost;
    // The process is gone (reaped). The channel is closed by then, after everything the child wrote
    // before it died was read: finished work is never lost with its worker. The child may be
    // started again from here.
    std::function<void(const ChildEnd& end)> on_exit;
  };

  explicit ChildWithChannel(uv_loop_t* loop) : loop_(loop) {}
  // Closes the channel and SIGKILLs a child still running: a supervisor that goes never leaves one.
  ~ChildWithChannel();
  ChildWithChannel(const ChildWithChannel&) = delete;
  ChildWithChannel& operator=(const ChildWithChannel&) = delete;

  // Starts args[0] with the channel on descriptor 3. Nothing is called back for a failed start.
  // A child still running is not started twice (hopeless = false).
  std::optional<StartFailure> Start(const std::vector<std::string>& args, ipc::Connection::Options channel,
                                     Callbacks callbacks);

  // False when there is no channel (not running, or its channel closed).
  bool Send(std::string frame, const std::vector<int>& fds = {});
  // SIGKILL; the exit is then reported with `reason` as its why (the first reason wins).
  void Kill(const std::string& reason);
  // SIGTERM, for a shutdown whose drain is over.
  void Terminate();
  // EOF to the child (it exits on its own) without the kill an unasked-for EOF brings.
  void CloseChannel();
  // Reads what the child has already written, without blocking; false when there is no channel or
  // nothing to read.
  bool DrainIfReadable();
  // The oldest descriptor received and not yet taken (the caller owns it), or -1.
  int TakeFd();

  bool running() const { return running_; }
  bool has_channel() const { return channel_ != nullptr; }
  int pid() const { return pid_; }

 private:
  void OnExit(int64_t exit_status, int term_signal);

  uv_loop_t* loop_;
  Callbacks callbacks_;
  std::unique_ptr<ipc::UvHandle<uv_process_t>> process_;
  ipc::Connection* channel_ = nullptr;  // the Connection owns itself; forgotten in its on_close
  int pid_ = 0;
  bool running_ = false;       // started and not yet reaped
  bool closing_channel_ = false;  // the EOF is ours: no kill
  std::string kill_reason_;
};

}  // namespace warmpool::supervisor
