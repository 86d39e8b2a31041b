#include "loader/format/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "loader/errors.h"
#include "loader/format/safetensors.h"

namespace metaload {
namespace {
std::atomic<uint64_t> g_bytes_read{0};
}  // namespace

uint64_t io_bytes_read() {
  return g_bytes_read.load(std::memory_order_relaxed);
}
void reset_io_bytes_read() {
  g_bytes_read.store(0, std::memory_order_relaxed);
}

namespace fileio {

void count_bytes_read(uint64_t n) {
  g_bytes_read.fetch_add(n, std::memory_order_relaxed);
}

namespace {

std::string mode_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

[[noreturn]] void not_a_file(const std::string& path, const std::string& kind) {
  throw FormatError(path, "", "not-a-file", "is " + kind + ", not a regular file");
}

}  // namespace

File::File(const std::string& path) : path_(path) {
  // O_NONBLOCK: open() of a FIFO returns at once instead of waiting for a writer; O_NOCTTY: a
  // terminal device never becomes the controlling terminal. Both are dropped for regular files.
  do {
    fd_.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  } while (!fd_ && errno == EINTR);
  if (!fd_) {
    const int err = errno;
    // ELOOP (a link loop), ENXIO (a socket), ... : say what is there rather than the errno.
    const std::string kind = file_kind(path);
    if (kind == "a dangling symbolic link") {
      throw FormatError(path, "", "unreadable",
                        "is a dangling symbolic link (cannot open for reading: " +
                            std::string(std::strerror(err)) + ")");
    }
    if (kind != "a regular file" && kind != "nothing" && kind.rfind("unreadable", 0) != 0) {
      not_a_file(path, kind);
    }
    throw FormatError(path, "", "unreadable",
                      std::string("cannot open for reading: ") + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd_.get(), &st) != 0) {
    throw FormatError(path, "", "unreadable", std::string("fstat failed: ") + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) not_a_file(path, mode_kind(st.st_mode));
  ::fcntl(fd_.get(), F_SETFL, ::fcntl(fd_.get(), F_GETFL) & ~O_NONBLOCK);
}

uint64_t File::regular_file_size() const {
  struct stat st;
  if (::fstat(fd(), &st) != 0) {
    throw FormatError(path_, "", "unreadable",
                      std::string("fstat failed: ") + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) not_a_file(path_, mode_kind(st.st_mode));
  return static_cast<uint64_t>(st.st_size);
}

void File::pread_full(void* buf, size_t n, uint64_t offset) const {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd(), p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw FormatError(path_, "", "read-failed",
                        "read of " + std::to_string(n) + " bytes at offset " +
                            std::to_string(offset) + " failed: " + std::strerror(errno));
    }
    if (r == 0) {
      throw FormatError(path_, "", "read-failed",
                        "file ended after " + std::to_string(offset + done) +
                            " bytes while reading " + std::to_string(n) + " bytes at offset " +
                            std::to_string(offset));
    }
    done += static_cast<size_t>(r);
    count_bytes_read(static_cast<uint64_t>(r));
  }
}

std::string read_small_file(const std::string& path, uint64_t max_size, const char* what) {
  File f(path);
  uint64_t size = f.regular_file_size();
  if (size > max_size) {
    throw FormatError(path, "", "file-too-large",
                      std::string(what) + " is " + std::to_string(size) + " bytes; the limit is " +
                          std::to_string(max_size));
  }
  std::string out(size, '\0');
  f.pread_full(out.data(), out.size(), 0);
  return out;
}

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

std::string real_path(const std::string& p) {
  char* r = ::realpath(p.c_str(), nullptr);
  if (!r) return "";
  std::string s(r);
  std::free(r);
  return s;
}

std::string file_kind(const std::string& p) {
  struct stat st;
  if (::stat(p.c_str(), &st) == 0) return mode_kind(st.st_mode);
  const int err = errno;
  if (err == ELOOP) return "a symbolic link loop";
  if (err == ENOENT) return ::lstat(p.c_str(), &st) == 0 ? "a dangling symbolic link" : "nothing";
  return std::string("unreadable (") + std::strerror(err) + ")";
}

}  // namespace fileio
}  // namespace metaload
