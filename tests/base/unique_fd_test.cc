// UniqueFd closes what it owns on every path, hands it on with release() and a move, and reports
// a failed close.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <utility>

#include "base/unique_fd.h"

namespace metaload {
namespace {

bool is_open(int fd) {
  return ::fcntl(fd, F_GETFD) != -1;
}

int open_null() {
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  return fd;
}

TEST(UniqueFd, ClosesWhenItGoesOutOfScopeAndWhenAnExceptionPasses) {
  int raw = -1;
  {
    UniqueFd fd(open_null());
    raw = fd.get();
    EXPECT_TRUE(fd.valid() && is_open(raw));
  }
  EXPECT_FALSE(is_open(raw));
  try {
    UniqueFd fd(open_null());
    raw = fd.get();
    throw std::runtime_error("an error path");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(is_open(raw));
}

TEST(UniqueFd, ReleaseAndMoveHandItOnWithoutClosing) {
  UniqueFd a(open_null());
  const int raw = a.get();
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());
  EXPECT_EQ(b.get(), raw);
  UniqueFd c;
  c = std::move(b);
  EXPECT_TRUE(is_open(raw));
  const int released = c.release();
  EXPECT_EQ(released, raw);
  EXPECT_FALSE(c.valid());
  EXPECT_TRUE(is_open(raw));
  ::close(released);
}

TEST(UniqueFd, ResetClosesTheOldOneAndKeepsErrno) {
  UniqueFd fd(open_null());
  const int first = fd.get();
  errno = ENOENT;
  fd.reset(open_null());
  EXPECT_EQ(errno, ENOENT);  // a caller's errno survives the cleanup
  EXPECT_TRUE(fd.valid());
  ASSERT_NE(fd.get(), first);  // the new one was opened while the old one was still open
  EXPECT_FALSE(is_open(first));
  fd.reset();
  EXPECT_FALSE(fd.valid());
}

TEST(UniqueFd, CloseReportsWhatCloseSays) {
  UniqueFd fd(open_null());
  EXPECT_EQ(fd.close(), 0);
  EXPECT_FALSE(fd.valid());
  EXPECT_EQ(fd.close(), 0);  // nothing held: nothing to report
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  UniqueFd stale(pipe_fds[0]);
  ::close(pipe_fds[0]);  // closed behind its back: close() must say so
  EXPECT_EQ(stale.close(), -1);
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
}  // namespace metaload
