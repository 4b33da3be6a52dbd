#include "common/file_version.h"

#include <sys/stat.h>

namespace warmpool {

namespace {

uint64_t Nanos(const timespec& t) {
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

}  // namespace

FileVersion FileVersionOf(const struct stat& st) {
  return FileVersion{static_cast<uint64_t>(st.st_size), Nanos(st.st_mtim), static_cast<uint64_t>(st.st_ino),
                     static_cast<uint64_t>(st.st_dev), Nanos(st.st_ctim)};
}

}  // namespace warmpool
