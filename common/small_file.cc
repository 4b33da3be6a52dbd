#include "common/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace warmpool {

Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  // O_NONBLOCK: a FIFO in the path must not hang the reader in open(); fstat refuses it after.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return Status(CodeForErrno(err), fmt::format("\"{}\": {}", path, std::strerror(err)));
  }
  struct stat st {};
  Status status;
  std::string text;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = Error(Code::kInvalidArgument, "\"{}\": not a regular file", path);
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    status = Error(Code::kInvalidArgument, "\"{}\": {} bytes, more than the {} such a file may have", path,
                   st.st_size, max_bytes);
  } else {
    text.resize(static_cast<size_t>(st.st_size) + 1);  // one more: a file that grew is seen
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = Status(CodeForErrno(errno), fmt::format("\"{}\": read failed: {}", path, std::strerror(errno)));
        break;
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    if (status.ok() && done > static_cast<size_t>(st.st_size)) {
      status = Error(Code::kInvalidArgument, "\"{}\": the file grew while it was read", path);
    }
    text.resize(done);
  }
  close(fd);
  if (!status.ok()) return status;
  return text;
}

}  // namespace warmpool
