// FileVersion (common/file_version.h) on the wire: one conversion each way, for the worker that
// reports what it read and the supervisor that records it.
#pragma once

#include "common/file_version.h"
#include "ipc/weights.pb.h"

namespace warmpool::ipc {

inline void SetFileVersion(v1::FileVersion* out, const FileVersion& v) {
  out->set_size(v.size);
  out->set_mtime_ns(v.mtime_ns);
  out->set_inode(v.inode);
  out->set_device(v.device);
  out->set_ctime_ns(v.ctime_ns);
}

inline FileVersion FileVersionFrom(const v1::FileVersion& v) {
  return FileVersion{v.size(), v.mtime_ns(), v.inode(), v.device(), v.ctime_ns()};
}

}  // namespace warmpool::ipc
