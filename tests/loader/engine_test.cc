// The streaming engines on real files: the plan (coalescing, splitting, gathering), the CPU engine
// and the staged (CUDA) engine's CPU twin on the same scenarios, tensor-parallel slices, every
// failure kind through injected faults, progress and the report. Torch-free.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/checked.h"
#include "kernels/convert.h"
#include "loader/engine/engine.h"
#include "loader/engine/engine_device.h"
#include "loader/engine/slots.h"
#include "loader/tp/slice.h"
#include "tests/loader/engine_test_util.h"

namespace metaload {
namespace {

using namespace testing_util;

enum class Engine { kCpu, kSim };

LoadReport run_engine(Engine e, const std::vector<std::string>& files,
                      const std::vector<CopyJob>& jobs, const EngineOptions& opt,
                      SimDeviceOptions sim = {}) {
  if (e == Engine::kCpu) return run_cpu_engine(files, jobs, opt);
  auto dev = make_sim_device_ops(sim);
  return run_staged_engine(files, jobs, *dev, opt);
}

// --- plan ---------------------------------------------------------------------------------------

std::vector<PlanFile> one_file(uint64_t size) {
  return {{"f.bin", size}};
}

// Tensors a, b and c back to back both in f.bin (from offset 100) and in `mem` (3000 bytes).
std::vector<CopyJob> adjacent_abc(std::vector<unsigned char>& mem) {
  std::vector<CopyJob> jobs = {whole("a", 0, 100, 1000), whole("b", 0, 1100, 1000),
                               whole("c", 0, 2100, 800)};
  jobs[0].dst = mem.data();
  jobs[1].dst = mem.data() + 1000;
  jobs[2].dst = mem.data() + 2000;
  return jobs;
}

TEST(PlanTest, CoalescesTensorsAdjacentInFileAndMemoryIntoOneRead) {
  std::vector<unsigned char> mem(3000);
  std::vector<CopyJob> jobs = adjacent_abc(mem);
  PlanLimits lim{1 << 20, 1 << 20, 0, 0};
  std::vector<Piece> p = plan_pieces(jobs, one_file(4000), lim);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[0].direct);
  EXPECT_EQ(p[0].offset, 100u);
  EXPECT_EQ(p[0].length, 2800u);
  EXPECT_EQ(p[0].direct_dst, mem.data());
  EXPECT_EQ(p[0].parts.size(), 3u);

  jobs[1].dst = mem.data() + 1008;  // a hole in memory: b cannot share a's read
  jobs[2].dst = mem.data() + 2008;
  p = plan_pieces(jobs, one_file(4000), lim);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].length, 1000u);
  EXPECT_EQ(p[1].length, 1800u);
}

TEST(PlanTest, SplitsLargeDirectReadsAtTheChunkSize) {
  std::vector<unsigned char> mem(10000);
  std::vector<CopyJob> jobs = {whole("big", 0, 0, 10000)};
  jobs[0].dst = mem.data();
  std::vector<Piece> p = plan_pieces(jobs, one_file(10000), {4096, 4096, 0, 0});
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].length, 4096u);
  EXPECT_EQ(p[2].offset, 8192u);
  EXPECT_EQ(p[2].length, 10000u - 8192u);
  EXPECT_EQ(p[2].direct_dst, mem.data() + 8192);
}

TEST(PlanTest, ConversionsGoThroughStagingInWholeElements) {
  std::vector<unsigned char> mem(20000);
  std::vector<CopyJob> jobs = {converting("w", 0, 0, 2500, FloatFormat::kF32, FloatFormat::kBF16)};
  jobs[0].dst = mem.data();
  std::vector<Piece> p = plan_pieces(jobs, one_file(10000), {1 << 20, 1003, 0, 0});
  uint64_t src = 0, dst = 0;
  for (const Piece& pc : p) {
    EXPECT_FALSE(pc.direct);
    EXPECT_LE(pc.length, 1003u);
    EXPECT_EQ(pc.length % 4, 0u);
    ASSERT_EQ(pc.parts.size(), 1u);
    EXPECT_EQ(pc.parts[0].dst, mem.data() + dst);  // half as many bytes land in the slot
    src += pc.length;
    dst += pc.parts[0].dst_bytes;
  }
  EXPECT_EQ(src, 10000u);
  EXPECT_EQ(dst, 5000u);
}

TEST(PlanTest, StridedSlicesAreGatheredOrReadRowByRow) {
  std::vector<unsigned char> mem(1 << 20);
  // 64 rows of 256 bytes every 1024 bytes: holes of 768 bytes, under the merge gap -> gathered.
  std::vector<CopyJob> jobs = {strided("o_proj", 0, 256, 64, 256, 1024)};
  jobs[0].dst = mem.data();
  std::vector<Piece> p = plan_pieces(jobs, one_file(1 << 16), {1 << 20, 1 << 20, 4096, 1 << 18});
  ASSERT_EQ(p.size(), 1u);
  ASSERT_EQ(p[0].parts.size(), 1u);
  EXPECT_EQ(p[0].parts[0].rows, 64u);
  EXPECT_EQ(p[0].parts[0].src_pitch, 1024u);
  EXPECT_EQ(p[0].length, 63u * 1024 + 256);

  // Holes larger than the merge gap: one direct read per row, straight into the slot.
  p = plan_pieces(jobs, one_file(1 << 16), {1 << 20, 1 << 20, 100, 128});
  ASSERT_EQ(p.size(), 64u);
  EXPECT_TRUE(p[5].direct);
  EXPECT_EQ(p[5].offset, 256u + 5 * 1024);
  EXPECT_EQ(p[5].direct_dst, mem.data() + 5 * 256);
}

TEST(PlanTest, StagedPlanMergesNeighboursWithSmallHolesIntoOneBuffer) {
  std::vector<unsigned char> mem(4096);
  std::vector<CopyJob> jobs = {whole("a", 0, 0, 100), whole("b", 0, 120, 100),
                               whole("c", 0, 5000, 100)};
  for (size_t i = 0; i < 3; ++i) jobs[i].dst = mem.data() + 1000 * i;
  std::vector<Piece> p = plan_pieces(jobs, one_file(6000), {0, 1 << 20, 64, 0});
  ASSERT_EQ(p.size(), 2u);  // a and b share a read (20-byte hole); c is too far
  EXPECT_FALSE(p[0].direct);
  EXPECT_EQ(p[0].length, 220u);
  EXPECT_EQ(p[0].parts[1].src, 120u);
}

TEST(PlanTest, JobsOutOfFileOrderAreReadInFileOffsetOrder) {
  std::vector<unsigned char> mem(3000);
  // Given last-to-first; the slots are in file order, so one read fills all three.
  std::vector<CopyJob> jobs = adjacent_abc(mem);
  std::reverse(jobs.begin(), jobs.end());
  std::vector<Piece> p = plan_pieces(jobs, one_file(4000), {1 << 20, 1 << 20, 0, 0});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].offset, 100u);
  EXPECT_EQ(p[0].length, 2800u);
  ASSERT_EQ(p[0].parts.size(), 3u);
  EXPECT_EQ(p[0].parts[0].job, 2u);  // a, b, c: ascending offsets
  EXPECT_EQ(p[0].parts[1].job, 1u);
  EXPECT_EQ(p[0].parts[2].job, 0u);
  // Staged (no direct reads) and too far apart to merge: still ascending pieces.
  jobs = {whole("z", 0, 9000, 100), whole("y", 0, 5000, 100), whole("x", 0, 0, 100)};
  for (size_t i = 0; i < 3; ++i) jobs[i].dst = mem.data() + 1000 * i;
  p = plan_pieces(jobs, one_file(10000), {0, 1 << 20, 64, 0});
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].offset, 0u);
  EXPECT_EQ(p[1].offset, 5000u);
  EXPECT_EQ(p[2].offset, 9000u);
}

TEST(PlanTest, ExactJobsAreNeverReadThroughAHole) {
  std::vector<unsigned char> mem(4096);
  // Rank 1 of 2 of two tensors: each rank slice sits between other ranks' rows (the holes).
  std::vector<CopyJob> jobs = {whole("a", 0, 100, 100), whole("b", 0, 300, 100),
                               whole("c", 0, 400, 100)};
  for (size_t i = 0; i < 3; ++i) jobs[i].dst = mem.data() + 1000 * i;
  for (bool convert : {false, true}) {
    for (auto& j : jobs) {
      j.exact = true;
      j.convert = convert;
      j.unit = convert ? 2 : 1;
      j.from = FloatFormat::kBF16;
    }
    std::vector<Piece> p = plan_pieces(jobs, one_file(1000), {0, 1 << 20, 64 << 10, 0});
    ASSERT_EQ(p.size(), 2u) << convert;  // b and c touch: one read; a's hole is not read
    EXPECT_EQ(p[0].offset, 100u);
    EXPECT_EQ(p[0].length, 100u);
    EXPECT_EQ(p[1].offset, 300u);
    EXPECT_EQ(p[1].length, 200u);
    // Next to one exact job is enough: a plain neighbour does not read through its hole either.
    jobs[1].exact = false;
    p = plan_pieces(jobs, one_file(1000), {0, 1 << 20, 64 << 10, 0});
    EXPECT_EQ(p.size(), 2u);
    jobs[0].exact = false;  // no exact job beside the hole: merged as before
    p = plan_pieces(jobs, one_file(1000), {0, 1 << 20, 64 << 10, 0});
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].length, 400u);
  }
}

TEST(PlanTest, ExactStridedSlicesReadEachRowAloneBackToBackInStaging) {
  std::vector<unsigned char> mem(1 << 20);
  // A rank's columns: 64 rows of 256 bytes every 1024 bytes; the 768-byte holes are other ranks'
  // rows, well under the merge gap, yet never read.
  std::vector<CopyJob> jobs = {strided("o_proj", 0, 256, 64, 256, 1024)};
  jobs[0].dst = mem.data();
  jobs[0].exact = true;
  std::vector<Piece> p = plan_pieces(jobs, one_file(1 << 16), {0, 1 << 20, 64 << 10, 0});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].length, 64u * 256);
  ASSERT_EQ(p[0].extents.size(), 64u);
  EXPECT_EQ(p[0].extents[3].offset, 256u + 3 * 1024);
  EXPECT_EQ(p[0].extents[3].length, 256u);
  ASSERT_EQ(p[0].parts.size(), 1u);
  EXPECT_EQ(p[0].parts[0].rows, 64u);
  EXPECT_EQ(p[0].parts[0].src_pitch, 256u);  // packed
  // Staging pieces of 24 rows: a second exact job further on in the file (another tensor's
  // slice) joins the last, unfilled one.
  jobs.push_back(strided("o_proj.b", 0, 256 + 64 * 1024, 8, 256, 1024));
  jobs[1].dst = mem.data() + 65536;
  jobs[1].exact = true;
  p = plan_pieces(jobs, one_file(1 << 17), {0, 6144, 64 << 10, 0});
  ASSERT_EQ(p.size(), 3u);  // 24 + 24 + (16 + 8) rows
  EXPECT_EQ(p[2].parts.size(), 2u);
  for (const Piece& pc : p) {
    EXPECT_EQ(pc.length, 6144u);
    EXPECT_EQ(pc.extents.size(), 24u);
    for (const Extent& e : pc.extents) {
      EXPECT_EQ((e.offset - 256) % 1024, 0u) << e.offset;
      EXPECT_EQ(e.length, 256u);
    }
  }
  // The CPU engine reads rows of at least direct_row_min straight into the slot, one by one.
  p = plan_pieces({jobs[0]}, one_file(1 << 16), {1 << 20, 1 << 20, 64 << 10, 128});
  ASSERT_EQ(p.size(), 64u);
  EXPECT_TRUE(p[7].direct);
  EXPECT_EQ(p[7].length, 256u);
}

TEST(PlanTest, MalformedJobsAreNamedErrors) {
  std::vector<unsigned char> mem(64);
  auto plan = [&](CopyJob j) {
    if (j.dst == nullptr) j.dst = mem.data();
    return plan_pieces({j}, one_file(1000), {1 << 20, 1 << 20, 0, 0});
  };
  CopyJob bad_file = whole("t", 3, 0, 16);
  EXPECT_THROW(plan(bad_file), PlanError);
  CopyJob bad_unit = converting("t", 0, 0, 4, FloatFormat::kF16, FloatFormat::kF32);
  bad_unit.unit = 4;
  EXPECT_THROW(plan(bad_unit), PlanError);
  EXPECT_THROW(plan(whole("t", 0, 0, 10, 4)), PlanError);        // 10 bytes of 4-byte elements
  EXPECT_THROW(plan(strided("t", 0, 0, 4, 32, 16)), PlanError);  // stride < row
  CopyJob huge = strided("t", 0, 0, 1ull << 62, 16, 1ull << 62);
  EXPECT_THROW(plan(huge), PlanError);  // overflow
  try {
    plan(whole("model.embed", 0, 900, 200));
    FAIL();
  } catch (const ReadError& e) {
    const std::string m = e.what();
    expect_contains(m, {"f.bin", "model.embed", "[900, 1100)"});
  }
  CopyJob no_dst = whole("t", 0, 0, 16);
  EXPECT_THROW(plan_pieces({no_dst}, one_file(1000), {1 << 20, 1 << 20, 0, 0}), PlanError);
  EXPECT_THROW(plan_pieces({whole("t", 0, 0, 16, 8)}, one_file(1000), {1 << 20, 4, 0, 0}),
               PlanError);  // staging smaller than an element
}

// --- engines on real files --------------------------------------------------------------------

// Bytes of the files some slot needs (each needed byte counted once).
uint64_t needed_bytes(const Scenario& s) {
  uint64_t total = 0;
  for (size_t f = 0; f < s.files.size(); ++f) {
    std::vector<bool> used(s.data[f].size());
    for (const CopyJob& j : s.jobs) {
      if (j.file != f) continue;
      for (uint64_t r = 0; r < j.rows; ++r) {
        for (uint64_t b = 0; b < j.row_bytes; ++b) used[j.offset + r * j.stride() + b] = true;
      }
    }
    total += std::count(used.begin(), used.end(), true);
  }
  return total;
}

class EngineTest : public ::testing::TestWithParam<Engine> {};

TEST_P(EngineTest, LoadsEveryKindOfJobWithAnyThreadsAndSizes) {
  struct Config {
    int threads;
    uint64_t chunk, staging;
    int ring, streams;
  };
  for (Config c : {Config{1, 16 << 20, 64 << 20, 4, 2}, Config{2, 256 << 10, 512 << 10, 2, 2},
                   Config{4, 64 << 10, 96 << 10, 3, 3}, Config{3, 1 << 20, 4096, 2, 2}}) {
    Scenario s;
    build_mixed(s);
    EngineOptions opt;
    opt.threads = c.threads;
    opt.chunk_bytes = c.chunk;
    opt.staging_bytes = c.staging;
    opt.ring_buffers = c.ring;
    opt.streams = c.streams;
    opt.bar = ProgressBar::kOff;
    // Both ways of faulting slot pages in.
    opt.slot_pages = c.threads % 2 == 0 ? SlotPages::kSmall : SlotPages::kHuge;
    SCOPED_TRACE("threads " + std::to_string(c.threads) + " chunk " + std::to_string(c.chunk) +
                 " staging " + std::to_string(c.staging));
    LoadReport r = run_engine(GetParam(), s.files, s.jobs, opt);
    s.check();
    uint64_t slot_bytes = 0, file_bytes = 0;
    for (const CopyJob& j : s.jobs) slot_bytes += j.dst_bytes();
    for (const FileReport& f : r.files) file_bytes += f.bytes;
    EXPECT_EQ(r.slot_bytes, slot_bytes);
    EXPECT_EQ(r.bytes, file_bytes);
    EXPECT_GE(r.bytes, needed_bytes(s));
    ASSERT_EQ(r.files.size(), 2u);
    EXPECT_EQ(r.files[1].path, s.files[1]);
    EXPECT_GT(r.files[0].seconds, 0);
    EXPECT_LE(r.peak_staging_bytes, c.staging);
    EXPECT_GT(r.seconds, 0);
    EXPECT_GE(r.reads, 1u);
  }
}

TEST_P(EngineTest, JobsInterleaveIntoOneSlotThroughTheDestinationPitch) {
  // A fused [in=64, out=3*48] tensor whose rank-1-of-2 slot takes columns [24, 48) of each of the
  // three sections: three strided jobs writing 24 of every 72 slot columns.
  Scenario s;
  s.add_file(64 * 144 * 4, 5);
  const uint64_t in = 64, sec = 48, take = 24;
  for (int variant = 0; variant < 4; ++variant) {
    const bool convert = variant & 1, exact = variant & 2;
    const uint64_t de = convert ? 2 : 4;
    std::vector<unsigned char> slot(in * 3 * take * de + 64, 0xEE);
    std::vector<CopyJob> jobs;
    for (uint64_t q = 0; q < 3; ++q) {
      CopyJob j = strided("c_attn." + std::to_string(q), 0, (q * sec + take) * 4, in, take * 4,
                          3 * sec * 4);
      if (convert) {
        j.convert = true;
        j.from = FloatFormat::kF32;
        j.to = FloatFormat::kBF16;
      }
      j.dst = slot.data() + q * take * de;
      j.dst_row_stride = 3 * take * de;
      j.exact = exact;  // a TP rank's slice: the other rank's columns are never read
      jobs.push_back(j);
    }
    EngineOptions opt;
    opt.bar = ProgressBar::kOff;
    opt.threads = 2;
    opt.staging_bytes = 16 << 10;                    // several packed pieces
    opt.merge_gap = convert || exact ? 1 << 20 : 0;  // gathered (or packed), and row by row
    const LoadReport rep = run_engine(GetParam(), s.files, jobs, opt);
    if (exact) {
      EXPECT_EQ(rep.bytes, in * 3 * take * 4) << "convert " << convert;
    } else if (convert) {
      EXPECT_GT(rep.bytes, in * 3 * take * 4);  // gathered through the holes
    }
    for (uint64_t r = 0; r < in; ++r) {
      for (uint64_t q = 0; q < 3; ++q) {
        std::vector<unsigned char> want(take * de);
        const unsigned char* src = s.data[0].data() + (r * 3 * sec + q * sec + take) * 4;
        convert_cpu(src, FloatFormat::kF32, want.data(),
                    convert ? FloatFormat::kBF16 : FloatFormat::kF32, take);
        ASSERT_EQ(std::memcmp(slot.data() + (r * 3 + q) * take * de, want.data(), want.size()), 0)
            << "row " << r << " section " << q << " convert " << convert;
      }
    }
    EXPECT_EQ(slot[in * 3 * take * de], 0xEE);  // nothing past the slot
  }
}

TEST_P(EngineTest, ReportsProgressUpToTheTotal) {
  Scenario s;
  build_mixed(s);
  EngineOptions opt;
  opt.chunk_bytes = 64 << 10;
  opt.bar = ProgressBar::kOff;
  std::vector<Progress> seen;
  opt.progress = [&](const Progress& p) { seen.push_back(p); };
  LoadReport r = run_engine(GetParam(), s.files, s.jobs, opt);
  ASSERT_FALSE(seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i].bytes_done, seen[i - 1].bytes_done);
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);
  EXPECT_EQ(seen.back().bytes_total, r.bytes);
}

TEST_P(EngineTest, ProgressBarOnStderrOnlyWhenAskedOrATerminal) {
  Scenario s;
  build_mixed(s);
  EngineOptions opt;
  opt.bar = ProgressBar::kOn;
  ::testing::internal::CaptureStderr();
  run_engine(GetParam(), s.files, s.jobs, opt);
  const std::string bar = ::testing::internal::GetCapturedStderr();
  expect_contains(bar, {"metaload [", "GB/s", "ETA"});
  EXPECT_EQ(bar.back(), '\n');
  opt.bar = ProgressBar::kAuto;  // stderr is a pipe here: silent
  ::testing::internal::CaptureStderr();
  run_engine(GetParam(), s.files, s.jobs, opt);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

// kAuto with stderr on a terminal: the bar appears (a pseudo-terminal stands in for one).
TEST_P(EngineTest, ProgressBarOnAnAutoDetectedTerminal) {
  Scenario s;
  build_mixed(s);
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0) GTEST_SKIP() << "no pseudo-terminal here: " << std::strerror(errno);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  const int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(slave, 0) << std::strerror(errno);
  ASSERT_TRUE(::isatty(slave));
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(slave, 2);
  EngineOptions opt;
  opt.bar = ProgressBar::kAuto;
  run_engine(GetParam(), s.files, s.jobs, opt);
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(slave);
  // The bar is short (well under the pty's buffer), so it is all there to read now.
  std::string got;
  char buf[4096];
  ::fcntl(master, F_SETFL, O_NONBLOCK);
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) got.append(buf, n);
  ::close(master);
  expect_contains(got, {"metaload [", "GB/s", "ETA"});
}

// Several readers really run: each read waits (up to 2 s) until a second thread has read too, so
// a single reader fails the test instead of passing by luck. The 2 s is no speed claim: a slow
// second thread only makes the first wait, and any read by it before the last piece passes.
TEST_P(EngineTest, SeveralReaderThreadsRun) {
  Scenario s;
  build_mixed(s);
  std::mutex mu;
  std::condition_variable cv;
  std::set<std::thread::id> readers;
  EngineOptions opt;
  opt.bar = ProgressBar::kOff;
  opt.threads = 2;
  opt.chunk_bytes = 64 << 10;  // many pieces
  opt.staging_bytes = 256 << 10;
  opt.hooks.pread = [&](int fd, void* buf, size_t n, uint64_t off) -> ssize_t {
    {
      std::unique_lock<std::mutex> lock(mu);
      readers.insert(std::this_thread::get_id());
      cv.notify_all();
      cv.wait_for(lock, std::chrono::seconds(2), [&] { return readers.size() >= 2; });
    }
    return ::pread(fd, buf, n, static_cast<off_t>(off));
  };
  LoadReport r = run_engine(GetParam(), s.files, s.jobs, opt);
  s.check();
  EXPECT_EQ(readers.size(), 2u);
  EXPECT_EQ(r.threads, 2);
}

TEST_P(EngineTest, ShortReadsAndInterruptedReadsAreResumed) {
  Scenario s;
  build_mixed(s);
  EngineOptions opt;
  opt.bar = ProgressBar::kOff;
  std::atomic<int> calls{0};
  opt.hooks.pread = [&](int fd, void* buf, size_t n, uint64_t off) -> ssize_t {
    if (++calls % 3 == 0) {
      errno = EINTR;
      return -1;
    }
    return ::pread(fd, buf, std::min<size_t>(n, 70001), static_cast<off_t>(off));
  };
  run_engine(GetParam(), s.files, s.jobs, opt);
  s.check();
}

// Lowers this process's RLIMIT_NOFILE soft limit to what is open now plus `spare`, for a scope.
class FileLimit {
 public:
  explicit FileLimit(rlim_t spare) {
    EXPECT_EQ(::getrlimit(RLIMIT_NOFILE, &saved_), 0);
    rlimit low = saved_;
    low.rlim_cur = open_now() + spare;
    EXPECT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  }
  ~FileLimit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  static rlim_t open_now() {
    rlim_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
      n += !e.is_directory();
    return n;
  }

 private:
  rlimit saved_{};
};

// A checkpoint may have far more shards than the process may open files (10,000 shards under
// ulimit -n 1024 failed with "Too many open files"): the engines keep at most a quarter of the
// limit open and still deliver every byte.
TEST_P(EngineTest, MoreFilesThanTheProcessMayOpen) {
  Scenario s;
  const size_t n = 1500;
  for (size_t f = 0; f < n; ++f) {
    s.add_file(256, static_cast<uint32_t>(f + 1));
    if (f % 3 == 0) {
      s.add(converting("c" + std::to_string(f), f, 0, 64, FloatFormat::kF32, FloatFormat::kBF16));
    } else {
      s.add(whole("w" + std::to_string(f), f, 0, 256));
    }
  }
  EngineOptions opt;
  opt.bar = ProgressBar::kOff;
  opt.threads = 4;
  std::atomic<rlim_t> most_open{0};
  opt.hooks.after_read = [&](size_t) {
    const rlim_t now = FileLimit::open_now();
    rlim_t seen = most_open.load();
    while (now > seen && !most_open.compare_exchange_weak(seen, now)) {
    }
  };
  const rlim_t before = FileLimit::open_now();
  {
    FileLimit limit(100);  // 1500 files, room for 100 more descriptors
    LoadReport r = run_engine(GetParam(), s.files, s.jobs, opt);
    EXPECT_EQ(r.files.size(), n);
  }
  s.check();
  EXPECT_LE(most_open.load(), before + 100);
  EXPECT_EQ(FileLimit::open_now(), before);  // every descriptor closed
}

// A file closed for the cap and opened again must still be the file that was planned.
TEST_P(EngineTest, FileReplacedWhileClosedIsNoticed) {
  Scenario s;
  for (size_t f = 0; f < 200; ++f) {
    s.add_file(256, static_cast<uint32_t>(f + 1));
    s.add(whole("w" + std::to_string(f), f, 0, 256));
  }
  EngineOptions opt;
  opt.bar = ProgressBar::kOff;
  opt.threads = 1;
  const std::string victim = s.files[150];
  opt.hooks.after_read = [&](size_t piece) {
    if (piece != 0) return;
    // Replaced by rename, as a download tool does: same size, another inode.
    std::ofstream(victim + ".new", std::ios::binary) << std::string(256, 'x');
    ASSERT_EQ(::rename((victim + ".new").c_str(), victim.c_str()), 0);
  };
  std::string msg;
  {
    FileLimit limit(40);  // keeps at most ~10 of the 200 open: shard150 is opened again
    try {
      run_engine(GetParam(), s.files, s.jobs, opt);
      ADD_FAILURE() << "no error";
    } catch (const ReadError& e) {
      msg = e.what();
    }
  }
  EXPECT_NE(msg.find("shard150.bin: file replaced during the load"), std::string::npos) << msg;
}

// A FIFO put where a planned file was must fail the load, not block it in open().
TEST_P(EngineTest, FifoInPlaceOfAFileFailsWithoutBlocking) {
  Scenario s;
  build_mixed(s);
  ASSERT_EQ(::unlink(s.files[1].c_str()), 0);
  ASSERT_EQ(::mkfifo(s.files[1].c_str(), 0644), 0);
  EngineOptions opt;
  opt.bar = ProgressBar::kOff;
  auto run = std::async(std::launch::async, [&]() -> std::string {
    try {
      run_engine(GetParam(), s.files, s.jobs, opt);
    } catch (const ReadError& e) {
      return e.what();
    }
    return "no error";
  });
  // A hang guard, not a speed claim: the load takes milliseconds; 20 s only catches a blocked one.
  if (run.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "the engine blocked opening a FIFO";
    const int fd = ::open(s.files[1].c_str(), O_WRONLY | O_NONBLOCK);  // releases it
    if (fd >= 0) ::close(fd);
  }
  const std::string m = run.get();
  EXPECT_NE(m.find("shard1.bin: is not a regular file"), std::string::npos) << m;
}

// Each failure kind: the engine throws the right type with a message naming the place, every
// thread has stopped, and the twin device holds no allocation.
class EngineFailureTest : public ::testing::TestWithParam<Engine> {
 protected:
  template <class E>
  std::string expect_failure(Scenario& s, EngineOptions opt, SimDeviceOptions sim = {}) {
    opt.bar = ProgressBar::kOff;
    opt.chunk_bytes = 128 << 10;
    opt.staging_bytes = 1 << 20;
    opt.threads = 2;
    std::string msg;
    try {
      run_engine(GetParam(), s.files, s.jobs, opt, sim);
      ADD_FAILURE() << "no error";
    } catch (const E& e) {
      msg = e.what();
    }
    EXPECT_EQ(sim_device_live_allocations(), 0);
    return msg;
  }
};

TEST_P(EngineFailureTest, MissingFile) {
  Scenario s;
  build_mixed(s);
  s.files[1] += ".gone";
  const std::string m = expect_failure<ReadError>(s, {});
  EXPECT_NE(m.find(".gone: cannot open: No such file"), std::string::npos) << m;
}

TEST_P(EngineFailureTest, FileShorterThanItsTensors) {
  Scenario s;
  build_mixed(s);
  ASSERT_EQ(::truncate(s.files[1].c_str(), 700000), 0);
  const std::string m = expect_failure<ReadError>(s, {});
  expect_contains(m, {"shard1.bin: file is 700000 bytes", "truncated"});
}

TEST_P(EngineFailureTest, FileTruncatedWhileReading) {
  Scenario s;
  build_mixed(s);
  EngineOptions opt;
  opt.hooks.pread = [](int fd, void* buf, size_t n, uint64_t off) -> ssize_t {
    if (off + n > 2100000) {  // everything from here on is gone
      if (off >= 2100000) return 0;
      n = 2100000 - off;
    }
    return ::pread(fd, buf, n, static_cast<off_t>(off));
  };
  const std::string m = expect_failure<ReadError>(s, opt);
  // Which reader hits the end first depends on timing; any of them names file, offset, tensor.
  expect_contains(m, {"shard0.bin: unexpected end of file at offset ", "while reading tensor '",
                      "the file was truncated"});
}

TEST_P(EngineFailureTest, ReadError) {
  Scenario s;
  build_mixed(s);
  EngineOptions opt;
  opt.hooks.pread = [](int fd, void* buf, size_t n, uint64_t off) -> ssize_t {
    if (off >= 1500000) {
      errno = EIO;
      return -1;
    }
    return ::pread(fd, buf, n, static_cast<off_t>(off));
  };
  const std::string m = expect_failure<metaload::ReadError>(s, opt);
  expect_contains(m, {"Input/output error", "tensor '"});
}

TEST_P(EngineFailureTest, CancelledFromAnotherThread) {
  Scenario s;
  build_mixed(s);
  std::atomic<bool> cancel{false};
  EngineOptions opt;
  opt.cancel = &cancel;
  opt.hooks.after_read = [&](size_t piece) {
    if (piece == 3) cancel = true;
  };
  const std::string m = expect_failure<LoadCancelled>(s, opt);
  EXPECT_NE(m.find("load cancelled after"), std::string::npos) << m;
}

TEST_P(EngineFailureTest, CancelledFromTheProgressCallback) {
  Scenario s;
  build_mixed(s);
  std::atomic<bool> cancel{false};
  EngineOptions opt;
  opt.cancel = &cancel;
  // Slow reads so the progress loop runs while readers are busy.
  opt.hooks.pread = [](int fd, void* buf, size_t n, uint64_t off) -> ssize_t {
    ::usleep(20000);
    return ::pread(fd, buf, n, static_cast<off_t>(off));
  };
  opt.progress = [&](const Progress&) { cancel = true; };
  expect_failure<LoadCancelled>(s, opt);
}

TEST_P(EngineFailureTest, ExceptionInAWorkerThread) {
  Scenario s;
  build_mixed(s);
  EngineOptions opt;
  opt.hooks.after_read = [](size_t piece) {
    if (piece == 5) throw std::runtime_error("injected worker failure");
  };
  const std::string m = expect_failure<std::runtime_error>(s, opt);
  EXPECT_EQ(m, "injected worker failure");
}

TEST_P(EngineFailureTest, MismatchFoundLate) {
  Scenario s;
  build_mixed(s);
  EngineOptions opt;
  opt.hooks.before_verify = [] { throw VerifyError("checksum of tensor 'q' does not match"); };
  const std::string m = expect_failure<VerifyError>(s, opt);
  EXPECT_NE(m.find("checksum"), std::string::npos);
}

TEST_P(EngineFailureTest, FileChangedDuringTheLoad) {
  Scenario s;
  build_mixed(s);
  EngineOptions opt;
  const std::string victim = s.files[0];
  opt.hooks.after_read = [victim](size_t piece) {
    if (piece == 0) std::ofstream(victim, std::ios::app) << "appended by someone else";
  };
  const std::string m = expect_failure<ReadError>(s, opt);
  EXPECT_NE(m.find("shard0.bin: file changed during the load"), std::string::npos) << m;
}

TEST_P(EngineFailureTest, ProgressCallbackThatThrows) {
  Scenario s;
  build_mixed(s);
  EngineOptions opt;
  opt.progress = [](const Progress&) { throw std::logic_error("callback failed"); };
  EXPECT_EQ(expect_failure<std::logic_error>(s, opt), "callback failed");
}

INSTANTIATE_TEST_SUITE_P(Engines, EngineTest, ::testing::Values(Engine::kCpu, Engine::kSim),
                         [](const auto& info) {
                           return info.param == Engine::kCpu ? "Cpu" : "Sim";
                         });
INSTANTIATE_TEST_SUITE_P(Engines, EngineFailureTest, ::testing::Values(Engine::kCpu, Engine::kSim),
                         [](const auto& info) {
                           return info.param == Engine::kCpu ? "Cpu" : "Sim";
                         });

// --- the staged engine's ring on the twin device --------------------------------------------

TEST(StagedEngineTest, SlowDeviceNeverSeesABufferRefilledEarly) {
  // Every device op sleeps, so readers run far ahead of the copies: only the events keep them from
  // overwriting a buffer still being copied.
  Scenario s;
  build_mixed(s);
  EngineOptions opt;
  opt.bar = ProgressBar::kOff;
  opt.threads = 3;
  opt.chunk_bytes = 64 << 10;
  opt.staging_bytes = 128 << 10;
  opt.ring_buffers = 2;
  opt.streams = 2;
  SimDeviceOptions sim;
  sim.op_delay_us = 300;
  LoadReport r = run_engine(Engine::kSim, s.files, s.jobs, opt, sim);
  s.check();
  EXPECT_EQ(r.peak_staging_bytes, 2u * (64 << 10));  // the ring, and nothing else on the host
  EXPECT_GT(r.peak_device_staging_bytes, 0u);        // conversions used device scratch
  EXPECT_EQ(r.engine, "staged:sim");
  EXPECT_EQ(sim_device_live_allocations(), 0);
}

TEST(StagedEngineTest, AsynchronousDeviceFaultFailsTheLoad) {
  for (long op : {0L, 7L, 40L}) {
    Scenario s;
    build_mixed(s);
    EngineOptions opt;
    opt.bar = ProgressBar::kOff;
    opt.chunk_bytes = 64 << 10;
    SimDeviceOptions sim;
    sim.fail_at_op = op;
    try {
      run_engine(Engine::kSim, s.files, s.jobs, opt, sim);
      ADD_FAILURE() << "no error for op " << op;
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("simulated device fault in queued operation " +
                                           std::to_string(op)),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(sim_device_live_allocations(), 0);
  }
}

TEST(StagedEngineTest, BadOptionsAreNamed) {
  Scenario s;
  build_mixed(s);
  auto dev = make_sim_device_ops();
  EngineOptions opt;
  opt.ring_buffers = 0;
  EXPECT_THROW(run_staged_engine(s.files, s.jobs, *dev, opt), PlanError);
  opt.ring_buffers = 2;
  opt.streams = 0;
  EXPECT_THROW(run_staged_engine(s.files, s.jobs, *dev, opt), PlanError);
  // One stream would serialise every copy; so would fewer buffers than streams.
  opt.streams = 1;
  try {
    run_staged_engine(s.files, s.jobs, *dev, opt);
    ADD_FAILURE() << "one stream was accepted";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("streams must be at least 2"), std::string::npos);
  }
  opt.streams = 3;
  EXPECT_THROW(run_staged_engine(s.files, s.jobs, *dev, opt), PlanError);
  EXPECT_EQ(sim_device_live_allocations(), 0);
}

TEST(StagedEngineTest, CopiesGoToAtLeastTwoStreams) {
  Scenario s;
  build_mixed(s);
  std::mutex mu;
  std::map<DeviceOps::Stream, int> copies;
  SimDeviceOptions sim;
  sim.on_queue = [&](DeviceOps::Stream st, const char* kind) {
    std::lock_guard<std::mutex> lock(mu);
    if (std::string(kind) == "copy") ++copies[st];
  };
  EngineOptions opt;
  opt.bar = ProgressBar::kOff;
  opt.threads = 2;
  opt.chunk_bytes = 64 << 10;  // many pieces
  LoadReport r = run_engine(Engine::kSim, s.files, s.jobs, opt, sim);
  s.check();
  EXPECT_EQ(copies.size(), 2u);  // the default: 2 streams, both used
  for (const auto& [stream, n] : copies) EXPECT_GT(n, 0);
}

TEST(CudaDeviceTest, WithoutAGpuIsATypedError) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU exists";
  EXPECT_THROW(make_cuda_device_ops(0), DeviceError);
}

TEST(CpuEngineTest, ReadsStraightIntoSlotsWhenNothingIsConverted) {
  Scenario s;
  s.add_file(4 << 20, 9);
  // One slot memory for three neighbouring tensors: one read fills all three.
  std::vector<unsigned char> arena(3 << 20);
  for (int i = 0; i < 3; ++i) {
    CopyJob j = whole("t" + std::to_string(i), 0, 1000 + i * (1 << 20), 1 << 20);
    j.dst = arena.data() + i * (1 << 20);
    s.jobs.push_back(j);
  }
  EngineOptions opt;
  opt.bar = ProgressBar::kOff;
  opt.chunk_bytes = 64 << 20;
  opt.threads = 1;
  LoadReport r = run_cpu_engine(s.files, s.jobs, opt);
  EXPECT_EQ(r.direct_bytes, 3u << 20);
  EXPECT_EQ(r.peak_staging_bytes, 0u);  // no staging buffer was ever made
  EXPECT_EQ(r.reads, 1u);
  EXPECT_EQ(std::memcmp(arena.data(), s.data[0].data() + 1000, 3 << 20), 0);
}

// --- tensor-parallel slices -------------------------------------------------------------------

TEST(TpTest, SliceRegions) {
  // [6, 8, 10] float32 stored at offset 100.
  SliceRegion r = slice_region({6, 8, 10}, 4, 100, {0, 1, 3}, "w");
  EXPECT_EQ(r.shape, (std::vector<int64_t>{2, 8, 10}));
  EXPECT_EQ(r.offset, 100u + 2 * 80 * 4);
  EXPECT_EQ(r.rows, 1u);
  EXPECT_EQ(r.row_bytes, 2u * 80 * 4);
  r = slice_region({6, 8, 10}, 4, 100, {1, 3, 4}, "w");
  EXPECT_EQ(r.shape, (std::vector<int64_t>{6, 2, 10}));
  EXPECT_EQ(r.rows, 6u);
  EXPECT_EQ(r.row_bytes, 80u);
  EXPECT_EQ(r.row_stride, 320u);
  EXPECT_EQ(r.offset, 100u + 3 * 80);
  r = slice_region({6, 8, 10}, 2, 0, {}, "norm");  // replicated
  EXPECT_EQ(r.row_bytes, 960u);
  EXPECT_EQ(r.shape, (std::vector<int64_t>{6, 8, 10}));
}

TEST(TpTest, ImpossibleSlicesAreNamedErrors) {
  try {
    slice_region({6, 8}, 4, 0, {1, 0, 3}, "model.layers.0.mlp.down_proj.weight");
    FAIL();
  } catch (const SliceError& e) {
    const std::string m = e.what();
    expect_contains(m, {"model.layers.0.mlp.down_proj.weight", "8 is not divisible by 3"});
  }
  EXPECT_THROW(slice_region({6, 8}, 4, 0, {2, 0, 2}, "w"), SliceError);  // no dim 2
  EXPECT_THROW(slice_region({6, 8}, 4, 0, {0, 2, 2}, "w"), SliceError);  // rank 2 of 2
  EXPECT_THROW(slice_region({6, 8}, 4, 0, {0, 0, 0}, "w"), SliceError);  // size 0
}

TEST(TpTest, SizesPast64BitsAreNamedErrorsNotWrappedNumbers) {
  // 2^40 x 2^40 x 4 bytes: 2^82, which used to wrap to a small row.
  try {
    slice_region({int64_t{1} << 40, int64_t{1} << 40}, 4, 0, {}, "huge\nweight");
    FAIL();
  } catch (const SizeOverflowError& e) {
    EXPECT_EQ(e.message(),
              "bytes of tensor \"huge\\nweight\": [1099511627776, 1099511627776] x 4 overflows "
              "(more than 2^64-1)");
  }
  EXPECT_THROW(slice_region({int64_t{1} << 40, int64_t{1} << 40}, 4, 0, {0, 1, 2}, "w"),
               SizeOverflowError);
  // The data offset plus the bytes must fit too.
  EXPECT_THROW(slice_region({16}, 4, UINT64_MAX - 8, {}, "w"), SizeOverflowError);
  TpShard shard;
  shard.dim = 0;
  shard.shape = {int64_t{1} << 40, int64_t{1} << 40};
  shard.ranges = {{0, 1}};
  EXPECT_THROW(shard_copies({int64_t{1} << 40, int64_t{1} << 40}, 4, 0, shard, "w"),
               SizeOverflowError);
}

TEST(SlotLayoutTest, ATotalPast64BitsIsANamedError) {
  std::vector<SlotRequest> requests(3);
  for (SlotRequest& r : requests) r.bytes = uint64_t{1} << 62;
  uint64_t total = 0;
  EXPECT_EQ(layout_slots({requests[0], requests[1], requests[2]}, &total).size(), 3u);
  EXPECT_EQ(total, 3 * (uint64_t{1} << 62));
  requests.push_back(requests[0]);
  try {
    layout_slots(requests, &total);
    FAIL();
  } catch (const SizeOverflowError& e) {
    EXPECT_NE(e.message().find("total slot bytes of the load"), std::string::npos) << e.message();
  }
}

// Every rank's slice of every dim, for every n dividing it, loaded by both engines (copied and
// converted) and put back together, equals the full load.
TEST(TpTest, RanksSlicesPutTogetherEqualTheFullLoad) {
  const std::vector<int64_t> shape = {12, 6, 8};
  const int64_t numel = 12 * 6 * 8;
  Scenario base;
  base.add_file(numel * 4 + 64, 21);
  for (Engine engine : {Engine::kCpu, Engine::kSim}) {
    for (bool convert : {false, true}) {
      const uint64_t out_elem = convert ? 2 : 4;
      CopyJob full_job = whole("w", 0, 64, numel * 4);
      if (convert) {
        full_job = converting("w", 0, 64, numel, FloatFormat::kF32, FloatFormat::kBF16);
      }
      const std::vector<unsigned char> full = expected(full_job, base.data[0]);
      for (int dim = 0; dim < 3; ++dim) {
        for (int n = 1; n <= shape[dim]; ++n) {
          if (shape[dim] % n != 0) continue;
          std::vector<std::vector<unsigned char>> parts(n);
          std::vector<CopyJob> jobs;
          for (int rank = 0; rank < n; ++rank) {
            CopyJob j = full_job;
            apply_region(j, slice_region(shape, 4, 64, {dim, rank, n}, "w"));
            parts[rank].resize(j.dst_bytes());
            j.dst = parts[rank].data();
            jobs.push_back(j);
          }
          EngineOptions opt;
          opt.bar = ProgressBar::kOff;
          opt.merge_gap = (dim + n) % 2 ? 0 : 1 << 20;  // both gathered and row-by-row reads
          run_engine(engine, base.files, jobs, opt);
          // Reassemble along `dim`: outer x (n chunks of chunk*inner) elements.
          int64_t outer = 1, inner = 1;
          for (int i = 0; i < dim; ++i) outer *= shape[i];
          for (int i = dim + 1; i < 3; ++i) inner *= shape[i];
          const uint64_t row = shape[dim] / n * inner * out_elem;
          std::vector<unsigned char> joined;
          for (int64_t o = 0; o < outer; ++o) {
            for (int rank = 0; rank < n; ++rank) {
              joined.insert(joined.end(), parts[rank].begin() + o * row,
                            parts[rank].begin() + (o + 1) * row);
            }
          }
          EXPECT_EQ(joined, full) << "dim " << dim << " n " << n << " convert " << convert;
        }
      }
    }
  }
}

// --- slots ------------------------------------------------------------------------------------

TEST(SlotsTest, LayoutKeepsFileNeighboursAdjacentAndEverySlotAligned) {
  std::vector<SlotRequest> req(5);
  req[0] = {1024, 4, 0, 0, true};
  req[1] = {500, 4, 0, 1024, true};  // follows req[0] in the file: adjacent in memory
  req[2] = {300, 4, 0, 1524, true};  // follows too, but right after req[1] it would not be aligned
  req[3] = {300, 2, 0, 1900, true};  // a hole in the file: new 64-byte aligned slot
  req[4] = {100, 4, 1, 0, false};    // another file
  uint64_t total = 0;
  std::vector<uint64_t> off = layout_slots(req, &total);
  EXPECT_EQ(off[0], 0u);
  EXPECT_EQ(off[1], 1024u);
  EXPECT_EQ(off[2], 1536u);
  EXPECT_EQ(off[3], 1856u);
  EXPECT_EQ(off[4], 2176u);
  EXPECT_EQ(total, 2276u);
  for (uint64_t o : off) EXPECT_EQ(o % 64, 0u);
}

TEST(SlotsTest, PageModeResolvesByFreePageReporting) {
  EXPECT_EQ(resolve_slot_pages(SlotPages::kHuge), SlotPages::kHuge);
  EXPECT_EQ(resolve_slot_pages(SlotPages::kSmall), SlotPages::kSmall);
  EXPECT_EQ(resolve_slot_pages(SlotPages::kAuto),
            free_page_reporting_active() ? SlotPages::kSmall : SlotPages::kHuge);
}

TEST(SlotsTest, ArenaIsHugePageAlignedAndCounted) {
  const int64_t before = HostArena::live_count();
  {
    auto a = HostArena::create(5 << 20);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % (2 << 20), 0u);
    EXPECT_EQ(a->size(), 5u << 20);
    std::memset(a->data(), 1, a->size());
    EXPECT_EQ(HostArena::live_count(), before + 1);
    EXPECT_GE(HostArena::live_bytes(), 5 << 20);
  }
  EXPECT_EQ(HostArena::live_count(), before);
}

}  // namespace
}  // namespace metaload
