// Helpers for torch-free format tests: scratch directories and hand-made files.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <future>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include <gtest/gtest.h>

namespace metaload {
namespace testing {

// A 40-hex commit id for hub cache trees made by hand (refs/main, snapshots/<commit>).
inline const std::string kCommitHash = "0123456789abcdef0123456789abcdef01234567";

// A fresh directory under TEST_TMPDIR (Bazel) or /tmp, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/metaload-test-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::string cmd = "rm -rf '" + path_ + "'";
    if (std::system(cmd.c_str()) != 0) {
      // Nothing sensible to do in a destructor; a leftover scratch dir is harmless.
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0) throw std::runtime_error("mkdir failed: " + path);
}

// u64 little-endian length prefix + header bytes as given + `data_bytes` zero bytes.
inline std::string raw_safetensors(const std::string& header, uint64_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += header;
  out.append(data_bytes, '\0');
  return out;
}

// Where the source tree is (tests read committed fixtures from it).
inline std::string source_dir() {
  const char* s = std::getenv("METALOAD_SOURCE_DIR");
  return s && *s ? s : ".";
}

// Runs f, which must throw exactly kind E (or a subclass); returns the caught error so the test can
// check rule(), tensor(), file() and the message. Records a test failure otherwise.
template <typename E, typename F>
E expect_error(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got: " << e.what();
    throw;
  }
  ADD_FAILURE() << "expected " << typeid(E).name() << ", nothing was thrown";
  throw std::runtime_error("no exception");
}

// Runs f on its own thread and rethrows what it threw. A call still running after 20 s -- a reader
// blocked in open() of a FIFO, which waits for a writer -- is a test failure: every FIFO in
// `fifos` is then opened for writing, which releases the reader, so the test still ends. (A hang
// guard, not a speed claim: the calls take milliseconds.)
inline void run_unblocked(const std::function<void()>& f, const std::vector<std::string>& fifos) {
  auto done = std::async(std::launch::async, f);
  if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked: a FIFO was opened for reading";
    for (const auto& p : fifos) {
      const int fd = ::open(p.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
  }
  done.get();
}

// Sets an environment variable for a scope and restores the previous state.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// Changes the working directory for a scope.
class ScopedCwd {
 public:
  explicit ScopedCwd(const std::string& dir) {
    if (!::getcwd(old_, sizeof old_) || ::chdir(dir.c_str()) != 0) throw std::runtime_error("cwd");
  }
  ~ScopedCwd() {
    if (::chdir(old_) != 0) std::abort();
  }

 private:
  char old_[PATH_MAX];
};

}  // namespace testing
}  // namespace metaload
