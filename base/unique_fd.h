// UniqueFd: the one owner of a POSIX file descriptor. Closed when it goes out of scope, so an error
// path (a throw between open and close) never leaks one; release() hands it on, close() reports
// what ::close says (a writer must see a failed close: NFS and quotas report write errors there).
// Torch-free, header-only.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <utility>

namespace metaload {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }

  // The descriptor, no longer owned.
  int release() { return std::exchange(fd_, -1); }
  // Closes the one held (if any) and owns `fd` instead; errors of that close are ignored.
  void reset(int fd = -1) {
    if (fd_ >= 0) {
      const int saved = errno;  // callers read errno of the failure that made them give up
      ::close(fd_);
      errno = saved;
    }
    fd_ = fd;
  }
  // Closes it now: 0, or -1 with errno as ::close left it. No longer owned either way.
  int close() { return fd_ < 0 ? 0 : ::close(release()); }

 private:
  int fd_ = -1;
};

}  // namespace metaload
