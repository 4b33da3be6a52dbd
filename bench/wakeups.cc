#include "bench/wakeups.h"

#include <dirent.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace warmpool::bench {

namespace {

pid_t ParentOf(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so read after the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  char state = 0;
  int parent = 0;
  if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &parent) != 2) return 0;
  return parent;
}

template <typename Fn>
void ForEachNumber(const std::string& directory, Fn&& fn) {
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long n = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0') fn(static_cast<pid_t>(n));
  }
  closedir(dir);
}

}  // namespace

std::vector<pid_t> WithChildren(pid_t pid) {
  std::vector<pid_t> pids{pid};
  ForEachNumber("/proc", [&](pid_t p) {
    if (p != pid && ParentOf(p) == pid) pids.push_back(p);
  });
  return pids;
}

uint64_t ContextSwitches(const std::vector<pid_t>& pids) {
  uint64_t total = 0;
  for (pid_t pid : pids) {
    const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
    ForEachNumber(tasks, [&](pid_t tid) {
      std::ifstream status(tasks + "/" + std::to_string(tid) + "/status");
      for (std::string line; std::getline(status, line);) {
        unsigned long long n = 0;
        if (std::sscanf(line.c_str(), "voluntary_ctxt_switches: %llu", &n) == 1 ||
            std::sscanf(line.c_str(), "nonvoluntary_ctxt_switches: %llu", &n) == 1) {
          total += n;
        }
      }
    });
  }
  return total;
}

}  // namespace warmpool::bench
