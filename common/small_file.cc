#include "common/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace warmpool {

namespace {

// O_NONBLOCK: a FIFO in the path must not hang the reader in open(); fstat refuses it after.
Result<int> OpenForReading(int dir, const std::string& name, bool beneath, const std::string& path) {
  if (beneath && (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)) {
    return Error(Code::kInvalidArgument, "\"{}\": not a file name in its directory", path);
  }
  const int fd = openat(dir, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (beneath ? O_NOFOLLOW : 0));
  if (fd < 0) {
    const int err = errno;
    if (beneath && err == ELOOP) {
      return Error(Code::kInvalidArgument,
                   "\"{}\" is a symlink: the files of a model directory are read without following "
                   "symlinks (copy them in)",
                   path);
    }
    return Status(CodeForErrno(err), fmt::format("\"{}\": {}", path, std::strerror(err)));
  }
  return fd;
}

Result<std::string> ReadOpen(int fd, const std::string& path, uint64_t max_bytes, FileVersion* version) {
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
  if (version != nullptr) *version = FileVersionOf(st);
  return text;
}

}  // namespace

Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  Result<int> fd = OpenForReading(AT_FDCWD, path, /*beneath=*/false, path);
  if (!fd.ok()) return fd.status();
  return ReadOpen(*fd, path, max_bytes, nullptr);
}

Result<std::string> ReadSmallFileAt(int dir, const std::string& name, uint64_t max_bytes, const std::string& shown,
                                    FileVersion* version) {
  Result<int> fd = OpenForReading(dir, name, /*beneath=*/true, shown);
  if (!fd.ok()) return fd.status();
  return ReadOpen(*fd, shown, max_bytes, version);
}

Result<int> OpenFileAt(int dir, const std::string& name, const std::string& shown) {
  Result<int> fd = OpenForReading(dir, name, /*beneath=*/true, shown);
  if (!fd.ok()) return fd.status();
  struct stat st {};
  if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(*fd);
    return Error(Code::kInvalidArgument, "\"{}\": not a regular file", shown);
  }
  // Reads block from here on (a regular file: O_NONBLOCK changes nothing, but says nothing wrong).
  return *fd;
}

}  // namespace warmpool
