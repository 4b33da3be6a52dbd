// libuv handles must stay allocated until their close callback has run; this wrapper makes that the
// only way they are freed. The handle lives on the heap and deletes itself in the close callback.
#pragma once

#include <uv.h>

namespace warmpool::ipc {

template <typename T>
class UvHandle {
 public:
  UvHandle() : handle_(new T{}) {}
  ~UvHandle() { Close(); }
  UvHandle(const UvHandle&) = delete;
  UvHandle& operator=(const UvHandle&) = delete;

  T* get() const { return handle_; }
  // Call after a successful uv_*_init; before that, Close simply frees the memory.
  void MarkInitialized() { initialized_ = true; }
  bool active() const { return handle_ != nullptr && initialized_; }

  void Close() {
    if (handle_ == nullptr) return;
    if (initialized_) {
      uv_close(reinterpret_cast<uv_handle_t*>(handle_),
               [](uv_handle_t* h) { delete reinterpret_cast<T*>(h); });
    } else {
      delete handle_;
    }
    handle_ = nullptr;
  }

 private:
  T* handle_;
  bool initialized_ = false;
};

}  // namespace warmpool::ipc
