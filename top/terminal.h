// The terminal while `warmpool top` runs full-screen: the alternate screen with the cursor hidden,
// keys read one by one without echo, and the signals that would end or suspend top caught, so that
// whatever ends it (q, Ctrl-C, SIGTERM, a closed terminal) the user's screen and line discipline
// come back as they were. Plain ANSI escapes: no curses library.
#pragma once

#include <termios.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace warmpool::top {

class Terminal {
 public:
  // stdout must be a terminal; keys are read when stdin is one too. One at a time per process.
  static Result<std::unique_ptr<Terminal>> Enter();
  ~Terminal();
  Terminal(const Terminal&) = delete;
  Terminal& operator=(const Terminal&) = delete;

  struct Size {
    size_t columns = 80;
    size_t rows = 24;
  };
  Size size() const;
  // Replaces the screen with these lines (each no wider than the screen), in one write.
  void Draw(const std::vector<std::string>& lines);

  enum class Wake {
    kTimeout,  // until passed
    kQuit,     // q, Ctrl-C, SIGTERM, SIGHUP, SIGQUIT
    kRedraw,   // the window changed size, or top was resumed after Ctrl-Z
    kWatched,  // watched_fd became readable
  };
  // Waits for the first of these; watched_fd -1: none.
  Wake Wait(std::chrono::steady_clock::time_point until, int watched_fd);

 private:
  Terminal() = default;
  void TakeOver();
  void GiveBack();
  void Suspend();
  Wake OnSignals();
  bool OnKeys();  // true for a key that quits

  bool raw_input_ = false;  // stdin is a terminal, its settings saved_ and changed while taken
  bool keys_ = false;       // keys are read (until stdin ends)
  bool taken_ = false;
  termios saved_{};
  int wake_pipe_[2] = {-1, -1};
};

}  // namespace warmpool::top
