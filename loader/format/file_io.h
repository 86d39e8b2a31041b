// Small POSIX file helpers of the format layer. Every byte they read is added to the counter
// behind io_bytes_read(), so byte-accounting tests see real reads. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/unique_fd.h"

namespace metaload {
namespace fileio {

// An open read-only file descriptor of a regular file, closed on destruction.
class File {
 public:
  // Opens without blocking (a FIFO would block open() until a writer came) and refuses anything
  // but a regular file: FormatError(path, "", "not-a-file") saying what it is instead (directory,
  // FIFO, socket, device, symbolic link loop); FormatError "unreadable" (strerror) when the file
  // cannot be opened.
  explicit File(const std::string& path);
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // A File over a descriptor already open on `path` (not owned): reads through it.
  File(int borrowed_fd, const std::string& path) : borrowed_(borrowed_fd), path_(path) {}

  int fd() const { return borrowed_ >= 0 ? borrowed_ : fd_.get(); }
  const std::string& path() const { return path_; }
  // The descriptor, owned by the caller from here (this File must not read any more).
  UniqueFd take() { return std::move(fd_); }
  // Size from fstat.
  uint64_t regular_file_size() const;
  // Reads exactly n bytes at offset (retrying short reads and EINTR); throws FormatError
  // "read-failed" on an error or an early end of file.
  void pread_full(void* buf, size_t n, uint64_t offset) const;

 private:
  UniqueFd fd_;
  int borrowed_ = -1;
  std::string path_;
};

// Reads a whole small file (index.json, config.json); rejects files over max_size with
// FormatError rule "file-too-large" naming `what`.
std::string read_small_file(const std::string& path, uint64_t max_size, const char* what);

void count_bytes_read(uint64_t n);

// Whether `path` is (or, through symbolic links, leads to) a directory / a regular file.
bool is_dir(const std::string& path);
bool is_file(const std::string& path);
// Whether anything is at `path` itself (lstat): a dangling symbolic link or a FIFO count.
bool exists(const std::string& path);

// The canonical absolute path of `path` (realpath), or "" when it cannot be resolved.
std::string real_path(const std::string& path);

// What is at `path`, through symbolic links, in words for messages: "a regular file",
// "a directory", "a FIFO (named pipe)", "a socket", "a character device", "a block device",
// "a symbolic link loop", "a dangling symbolic link", "nothing" (no such entry), or
// "unreadable (<strerror>)".
std::string file_kind(const std::string& path);

}  // namespace fileio
}  // namespace metaload
