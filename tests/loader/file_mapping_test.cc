// The zero-copy contract (loader/engine/file_mapping.h): what happens to a mapped checkpoint file
// that is truncated, overwritten in place, replaced by rename or deleted while tensors map it.
#include "loader/engine/file_mapping.h"

#include "loader/engine/page_cache.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;
using testing::TempDir;

constexpr uint64_t kSize = 1 << 20;

// kSize bytes: byte i is i * 7 + salt.
std::string pattern(int salt) {
  std::string s(kSize, '\0');
  for (uint64_t i = 0; i < kSize; ++i) s[i] = static_cast<char>(i * 7 + salt);
  return s;
}

void write_file(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
}

// The file's modification time a day back, so that a write in place changes it even on
// filesystems with coarse timestamps.
void age(const std::string& path) {
  struct timespec times[2] = {{0, UTIME_OMIT}, {::time(nullptr) - 86400, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

bool holds(const FileMapping& m, const std::string& bytes) {
  return m.size() == bytes.size() && std::string(reinterpret_cast<const char*>(m.data()),
                                                 m.size()) == bytes;  // reads every page
}

std::shared_ptr<FileMapping> map_whole(const std::string& path) {
  auto m = FileMapping::open(path, kSize);
  m->populate(0, kSize);
  return m;
}

// Where this process gets a read lease (its own file, a local filesystem), a writer waits while
// the mapping copies its bytes, and the tensors keep what they loaded.
class LeasedMapping : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_ / "model.safetensors";
    write_file(path_, pattern(1));
    map_ = map_whole(path_);
    if (map_->guard() != MappingGuard::kLease)
      GTEST_SKIP() << "no read lease on " << dir_.path() << " (filesystem or permissions)";
  }
  TempDir dir_;
  std::string path_;
  std::shared_ptr<FileMapping> map_;
};

TEST_F(LeasedMapping, TruncationInPlaceDetachesFirst) {
  const int64_t detached = FileMapping::detached_count();
  ASSERT_EQ(::truncate(path_.c_str(), 0), 0);  // waits until the bytes are copied
  EXPECT_EQ(map_->guard(), MappingGuard::kDetached);
  EXPECT_EQ(FileMapping::detached_count(), detached + 1);
  EXPECT_TRUE(holds(*map_, pattern(1)));  // every page readable: no SIGBUS
  map_->check();
  struct stat st {};  // and the truncation did happen
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
}

TEST_F(LeasedMapping, OverwriteInPlaceDetachesFirst) {
  const int fd = ::open(path_.c_str(), O_WRONLY);  // waits until the bytes are copied
  ASSERT_GE(fd, 0);
  const std::string other = pattern(2);
  ASSERT_EQ(::pwrite(fd, other.data(), other.size(), 0), static_cast<ssize_t>(other.size()));
  ::close(fd);
  EXPECT_EQ(map_->guard(), MappingGuard::kDetached);
  EXPECT_TRUE(holds(*map_, pattern(1)));
  map_->check();
  // A weight written by the model stays the model's.
  map_->data()[5] = 42;
  EXPECT_EQ(map_->data()[5], 42);
}

TEST_F(LeasedMapping, ReplacementByRenameAndDeletionNeedNothing) {
  write_file(dir_ / "new", pattern(3));
  ASSERT_EQ(::rename((dir_ / "new").c_str(), path_.c_str()), 0);
  EXPECT_EQ(map_->guard(), MappingGuard::kLease);  // the mapped inode was never opened to write
  map_->check();
  EXPECT_TRUE(holds(*map_, pattern(1)));
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  map_->check();
  EXPECT_TRUE(holds(*map_, pattern(1)));
}

TEST_F(LeasedMapping, DetachOnRequestFreesTheFile) {
  map_->detach();
  map_->detach();  // idempotent
  EXPECT_EQ(map_->guard(), MappingGuard::kDetached);
  ASSERT_EQ(::truncate(path_.c_str(), 10), 0);
  EXPECT_TRUE(holds(*map_, pattern(1)));
}

TEST_F(LeasedMapping, AForkedChildChecksWhatItInheritedAndLeasesItsOwnMappings) {
  const std::string other = dir_ / "other.safetensors";
  write_file(other, pattern(2));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The parent's watcher detaches the parent's copy, not this one: the child checks it.
    if (map_->guard() != MappingGuard::kChecked) std::_Exit(1);
    auto mine = FileMapping::open(other, kSize);  // starts the child's own watcher
    if (mine->guard() != MappingGuard::kLease) std::_Exit(2);
    if (::truncate(other.c_str(), 0) != 0 || mine->guard() != MappingGuard::kDetached)
      std::_Exit(3);
    std::_Exit(holds(*mine, pattern(2)) ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(map_->guard(), MappingGuard::kLease);  // the parent's own is leased as before
}

// Without a lease (here: a writer already has the file open, so the kernel refuses one), a change
// is found by check(), which names the file.
class CheckedMapping : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_ / "model.safetensors";
    write_file(path_, pattern(1));
    age(path_);
    writer_ = ::open(path_.c_str(), O_WRONLY);
    ASSERT_GE(writer_, 0);
    map_ = map_whole(path_);
    ASSERT_EQ(map_->guard(), MappingGuard::kChecked);
    map_->check();  // unchanged so far
  }
  void TearDown() override {
    if (writer_ >= 0) ::close(writer_);
  }
  TempDir dir_;
  std::string path_;
  int writer_ = -1;
  std::shared_ptr<FileMapping> map_;
};

TEST_F(CheckedMapping, TruncationInPlaceIsAFileChangedErrorNamingTheFile) {
  ASSERT_EQ(::ftruncate(writer_, 4096), 0);
  const FileChangedError e = expect_error<FileChangedError>([&] { map_->check(); });
  const std::string msg = e.what();
  EXPECT_NE(msg.find(path_ + ": the file was truncated to 4096 bytes (1048576 when mapped)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("load the model again"), std::string::npos) << msg;
  expect_error<ReadError>([&] { map_->check(); });  // a ReadError like any other
  // Faulting pages in past the end is a ReadError too, never a signal.
  expect_error<ReadError>([&] { map_->populate(0, kSize); });
  // A changed file cannot be detached as it was.
  expect_error<FileChangedError>([&] { map_->detach(); });
}

TEST_F(CheckedMapping, OverwriteInPlaceIsAFileChangedErrorNamingTheFile) {
  const std::string other = pattern(2);
  ASSERT_EQ(::pwrite(writer_, other.data(), other.size(), 0), static_cast<ssize_t>(other.size()));
  const FileChangedError e = expect_error<FileChangedError>([&] { map_->check(); });
  EXPECT_NE(std::string(e.what()).find(path_ + ": the file was written in place"),
            std::string::npos)
      << e.what();
}

TEST_F(CheckedMapping, ReplacementByRenameAndDeletionAreFine) {
  write_file(dir_ / "new", pattern(3));
  ASSERT_EQ(::rename((dir_ / "new").c_str(), path_.c_str()), 0);
  map_->check();  // the descriptor still names the mapped inode, unchanged
  EXPECT_TRUE(holds(*map_, pattern(1)));
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  map_->check();
}

TEST(FileMappingTest, ContainingFindsTheMappingOfAnAddress) {
  TempDir dir;
  write_file(dir / "a", pattern(1));
  auto m = FileMapping::open(dir / "a", kSize);
  EXPECT_EQ(FileMapping::containing(m->data()), m);
  EXPECT_EQ(FileMapping::containing(m->data() + kSize - 1), m);
  EXPECT_NE(FileMapping::containing(m->data() + kSize), m);
  int on_the_stack = 0;
  EXPECT_EQ(FileMapping::containing(&on_the_stack), nullptr);
  unsigned char* data = m->data();
  const int64_t live = FileMapping::live_count();
  m.reset();
  EXPECT_EQ(FileMapping::live_count(), live - 1);
  EXPECT_EQ(FileMapping::containing(data), nullptr);
}

TEST(FileMappingTest, ASigbusOnAMappedFileNamesItBeforeTheProcessEnds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // this process runs a watcher thread
  TempDir dir;
  const std::string path = dir / "sigbus.safetensors";
  write_file(path, pattern(1));
  EXPECT_EXIT(
      {
        // No lease (a writer has it open), so a truncation lands under the mapping.
        const int writer = ::open(path.c_str(), O_WRONLY);
        auto m = FileMapping::open(path, kSize);
        if (writer < 0 || m->guard() != MappingGuard::kChecked || ::ftruncate(writer, 0) != 0)
          std::_Exit(3);
        volatile unsigned char b = m->data()[5 * 4096 + 7];
        (void)b;
        std::_Exit(4);  // not reached
      },
      ::testing::KilledBySignal(SIGBUS),
      "metaload: SIGBUS reading .*/sigbus\\.safetensors at byte 20487, mapped zero-copy");
}

TEST(FileMappingTest, PastAQuarterOfTheOpenFileLimitFilesAreCheckedByPath) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  for (int i = 0; i < 6; ++i) {
    write_file(dir / std::to_string(i), pattern(i));
    age(dir / std::to_string(i));
  }
  EXPECT_EXIT(
      {
        // 12 descriptors at most: 3 mapped files may stay open, the rest are checked by path.
        struct rlimit rl {};
        ::getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = 12;
        if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) std::_Exit(3);
        std::vector<std::shared_ptr<FileMapping>> maps;
        for (int i = 0; i < 6; ++i)
          maps.push_back(FileMapping::open(dir / std::to_string(i), kSize));
        for (int i = 0; i < 6; ++i) {
          const bool held = maps[i]->guard() == MappingGuard::kLease;
          if (held != (i < 3)) std::_Exit(10 + i);
        }
        // Replaced by rename: the path names another inode; fine.
        write_file(dir / "new", pattern(9));
        if (::rename((dir / "new").c_str(), (dir / "4").c_str()) != 0) std::_Exit(5);
        maps[4]->check();
        // Written in place: found through the path.
        const int fd = ::open((dir / "5").c_str(), O_WRONLY);
        if (fd < 0 || ::pwrite(fd, "x", 1, 0) != 1) std::_Exit(6);
        try {
          maps[5]->check();
        } catch (const FileChangedError&) {
          std::_Exit(0);
        }
        std::_Exit(7);
      },
      ::testing::ExitedWithCode(0), "");
}

// Pages of the mapping in the page cache (mincore), as a count.
uint64_t cached_pages(const FileMapping& m) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((m.size() + page - 1) / page);
  if (::mincore(m.data(), m.size(), v.data()) != 0) return 0;
  uint64_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

// populate_uncached faults in only what the page cache lacks: nothing for a cached file, the
// evicted pages (and then they are cached) for one the kernel dropped.
TEST(FileMappingPopulate, FaultsInOnlyThePagesTheCacheLacks) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  const std::string bytes = pattern(3);
  write_file(path, bytes);
  auto m = FileMapping::open(path, kSize);
  ASSERT_TRUE(holds(*m, bytes));  // every page read: cached
  EXPECT_EQ(m->populate_uncached(0, kSize), 0u);
  m.reset();
  // Drop the file's pages (clean after fsync); some filesystems keep them anyway.
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  m = FileMapping::open(path, kSize);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t before = cached_pages(*m);
  if (before * page >= kSize) GTEST_SKIP() << "the kernel kept the file's pages cached";
  const uint64_t faulted = m->populate_uncached(4096, kSize - 8192);
  EXPECT_GT(faulted, 0u);
  EXPECT_LE(faulted, kSize - before * page);
  EXPECT_GT(cached_pages(*m), before);
  EXPECT_TRUE(holds(*m, bytes));
}

const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

// Leaves only pages `keep` of the file in the page cache: all dropped (clean after fdatasync; no
// mapping may hold them), then those read back one by one without readahead. A partial drop
// would not do: the kernel keeps a large folio whole. The caller checks what is cached.
void cache_only(const std::string& path, const std::vector<uint64_t>& keep) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  std::vector<char> buf(kPage);
  for (uint64_t p : keep)
    ASSERT_EQ(::pread(fd, buf.data(), kPage, static_cast<off_t>(p * kPage)),
              static_cast<ssize_t>(kPage));
  ::close(fd);
}

// Every page index of the file but `except`.
std::vector<uint64_t> pages_but(const std::vector<uint64_t>& except) {
  std::vector<uint64_t> out;
  for (uint64_t p = 0; p < kSize / kPage; ++p)
    if (std::find(except.begin(), except.end(), p) == except.end()) out.push_back(p);
  return out;
}

// Waits up to 20 s for `done`: a hang guard, not a speed claim (a background read of 1 MiB takes
// milliseconds; the bound only keeps a thread that never finishes from blocking the test).
template <class F>
bool eventually(F done) {
  for (int i = 0; i < 2000 && !done(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return done();
}

// Scattered missing pages: populate_uncached reads exactly those runs (all in flight together).
TEST(FileMappingPopulate, ReadsScatteredMissingRunsAndNothingElse) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  const std::string bytes = pattern(4);
  write_file(path, bytes);
  cache_only(path, pages_but({3, 10, 50, 51, 52, 200}));
  auto m = FileMapping::open(path, kSize);
  const uint64_t missing = kSize / kPage - cached_pages(*m);
  if (missing == 0) GTEST_SKIP() << "the kernel kept the file's pages cached";
  EXPECT_EQ(missing, 6u);
  EXPECT_EQ(m->populate_uncached(0, kSize), missing * kPage);
  EXPECT_EQ(cached_pages(*m), kSize / kPage);
  EXPECT_EQ(m->populate_uncached(0, kSize), 0u);
  EXPECT_TRUE(holds(*m, bytes));
}

// cachestat's counts per window, and the sample map_slots decides a warm load by.
TEST(PageCacheSample, CountsTheCachedPagesOfItsWindows) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  write_file(path, pattern(5));
  auto m = FileMapping::open(path, kSize);
  m->populate(0, kSize);
  const int64_t all = m->cached_pages({{0, kSize}});
  if (all < 0) GTEST_SKIP() << "no cachestat in this kernel";
  EXPECT_EQ(all, static_cast<int64_t>(kSize / kPage));
  EXPECT_EQ(m->cached_pages({{0, 4 * kPage}, {8 * kPage, 2 * kPage}, {kPage, 0}}), 6);
  CacheSample s = sample_page_cache({{m, 0, kSize}});
  EXPECT_TRUE(s.known);
  EXPECT_EQ(s.pages, kSize / kPage);  // 1 MiB: 16 windows of 64 KiB cover it whole
  EXPECT_EQ(s.cached, s.pages);
  // 5 pages in two ranges: one window, from their first byte to the first range's end.
  s = sample_page_cache({{m, 0, 2 * kPage}, {m, kSize - 3 * kPage, 3 * kPage}});
  EXPECT_TRUE(s.known);
  EXPECT_EQ(s.pages, 2u);
  // 128 KiB in two ranges: two windows, the second at the second range's own file offset.
  s = sample_page_cache({{m, 0, 64 << 10}, {m, kSize / 2, 64 << 10}});
  EXPECT_EQ(s.pages, 2 * (64 << 10) / kPage);
  EXPECT_EQ(s.cached, s.pages);
  EXPECT_EQ(sample_page_cache({}).pages, 0u);
  m.reset();
  std::vector<uint64_t> first_half;
  for (uint64_t p = 0; p < kSize / 2 / kPage; ++p) first_half.push_back(p);
  cache_only(path, first_half);
  m = FileMapping::open(path, kSize);
  const uint64_t cached = cached_pages(*m);
  if (cached == kSize / kPage) GTEST_SKIP() << "the kernel kept the file's pages cached";
  s = sample_page_cache({{m, 0, kSize}});
  EXPECT_EQ(s.cached, cached);
  EXPECT_EQ(m->cached_pages({{0, kSize / 2}}), static_cast<int64_t>(kSize / 2 / kPage));
  // The second window lies in the evicted half: the sample sees it there.
  s = sample_page_cache({{m, 0, 64 << 10}, {m, kSize / 2, 64 << 10}});
  EXPECT_EQ(s.cached, (64 << 10) / kPage);
  EXPECT_EQ(s.pages, 2 * (64 << 10) / kPage);
}

// The background read-ahead brings the missing pages into the cache without mapping them, and
// lets go of mappings freed meanwhile.
TEST(PageCacheSample, PrefetchInBackgroundReadsTheMissingPages) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  const std::string bytes = pattern(6);
  write_file(path, bytes);
  cache_only(path, {});
  auto m = FileMapping::open(path, kSize);
  if (cached_pages(*m) == kSize / kPage) GTEST_SKIP() << "the kernel kept the file's pages cached";
  ASSERT_TRUE(prefetch_in_background({{m, 0, kSize}}));
  EXPECT_TRUE(eventually([] { return background_prefetches() == 0; }));
  EXPECT_TRUE(eventually([&] { return cached_pages(*m) == kSize / kPage; }));
  EXPECT_TRUE(holds(*m, bytes));
  // A mapping gone before the thread's turn: skipped, and the thread holds it no longer.
  const int64_t live = FileMapping::live_count();
  auto gone = FileMapping::open(path, kSize);
  std::weak_ptr<FileMapping> weak = gone;
  ASSERT_TRUE(prefetch_in_background({{gone, 0, kSize}}));
  gone.reset();
  EXPECT_TRUE(eventually([] { return background_prefetches() == 0; }));
  EXPECT_TRUE(weak.expired());
  EXPECT_EQ(FileMapping::live_count(), live);
}

}  // namespace
}  // namespace metaload
