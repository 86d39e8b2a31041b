#include "loader/engine/engine.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <mutex>

#include "base/checked.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "loader/engine/engine_device.h"
#include "loader/engine/page_copy.h"
#include "loader/engine/progress.h"
#include "loader/engine/slots.h"

namespace metaload {

namespace {

std::string describe_job(const CopyJob& j) {
  return "tensor " + quote_text(j.name, '\'');
}

// base/checked.h's checks, in the out-parameter form validate_job chains.
bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  const std::optional<uint64_t> r = add_or_none(a, b);
  if (r) *out = *r;
  return !r;
}
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  const std::optional<uint64_t> r = mul_or_none(a, b);
  if (r) *out = *r;
  return !r;
}

// A stretch of one job that is read as one unit: `rows` rows `stride` apart (rows > 1 only for a
// gathered strided slice, which is never split), landing at dst_off in the job's slot.
struct Segment {
  size_t job;
  size_t file;
  uint64_t offset;
  uint64_t rows;
  uint64_t row_bytes;
  uint64_t stride;
  uint64_t dst_off;
  bool direct;          // may be read straight into the slot
  bool packed = false;  // an exact job's rows: each read alone, back to back in staging
  uint64_t footprint() const { return (rows - 1) * stride + row_bytes; }
};

void validate_job(const CopyJob& j, size_t index, const std::vector<PlanFile>& files) {
  auto fail = [&](const std::string& what) {
    throw PlanError("copy job " + std::to_string(index) + " (" + describe_job(j) + "): " + what);
  };
  if (j.file >= files.size()) {
    fail("file index " + std::to_string(j.file) + " but only " + std::to_string(files.size()) +
         " files were given");
  }
  if (j.unit == 0) fail("element size 0");
  if (j.convert && j.unit != float_format_size(j.from)) {
    fail(std::string("converts from ") + float_format_name(j.from) + " but its element size is " +
         std::to_string(j.unit));
  }
  if (j.row_bytes % j.unit != 0) {
    fail("row of " + std::to_string(j.row_bytes) + " bytes is not a whole number of " +
         std::to_string(j.unit) + "-byte elements");
  }
  if (j.rows > 1 && j.stride() < j.row_bytes) {
    fail("row stride " + std::to_string(j.stride()) + " is smaller than the row (" +
         std::to_string(j.row_bytes) + " bytes)");
  }
  if (j.rows > 1 && j.dst_pitch() < j.dst_row_bytes()) {
    fail("destination row stride " + std::to_string(j.dst_pitch()) +
         " is smaller than the destination row (" + std::to_string(j.dst_row_bytes()) + " bytes)");
  }
  uint64_t span = 0, end = 0, dst = 0;
  if (j.rows == 0 || j.row_bytes == 0) return;
  if (mul_overflows(j.rows - 1, j.stride(), &span) || add_overflows(span, j.row_bytes, &span) ||
      add_overflows(j.offset, span, &end) || mul_overflows(j.rows - 1, j.dst_pitch(), &dst) ||
      add_overflows(dst, j.dst_row_bytes(), &dst)) {
    fail("byte range overflows 64 bits");
  }
  if (j.dst == nullptr) fail("no destination memory");
  const PlanFile& f = files[j.file];
  if (end > f.size) {
    throw ReadError(f.path + ": file is " + std::to_string(f.size) + " bytes but " +
                    describe_job(j) + " needs bytes [" + std::to_string(j.offset) + ", " +
                    std::to_string(end) + ") (truncated or wrong file)");
  }
}

// The staging bound must give every reader thread (CPU) or ring buffer (staged) room for one
// element of the widest tensor; said in the caller's terms (staging_bytes), not in pieces.
void check_staging(const std::vector<CopyJob>& jobs, uint64_t staging_bytes, uint64_t parts,
                   const char* part_name) {
  uint32_t unit = 1;
  for (const CopyJob& j : jobs) unit = std::max(unit, j.unit);
  const uint64_t each = staging_bytes / parts;
  if (each >= unit) return;
  const uint64_t need = checked_mul<uint64_t>(unit, parts, "the smallest staging_bytes");
  throw PlanError("staging_bytes " + std::to_string(staging_bytes) + " split among " +
                  std::to_string(parts) + " " + part_name + " leaves " + std::to_string(each) +
                  " bytes each, less than one " + std::to_string(unit) +
                  "-byte element: staging_bytes must be at least " + std::to_string(need));
}

uint64_t round_down(uint64_t v, uint64_t unit) {
  return v / unit * unit;
}

}  // namespace

namespace {

// Step 1 of plan_pieces: every job valid, and the staging piece holds one element of each.
void check_jobs(const std::vector<CopyJob>& jobs, const std::vector<PlanFile>& files,
                uint64_t cap) {
  uint32_t max_unit = 1;
  for (size_t i = 0; i < jobs.size(); ++i) {
    validate_job(jobs[i], i, files);
    max_unit = std::max(max_unit, jobs[i].unit);
  }
  if (cap < max_unit) {
    throw PlanError("staging piece of " + std::to_string(cap) + " bytes cannot hold one " +
                    std::to_string(max_unit) + "-byte element: raise staging_bytes");
  }
}

// Step 2: one job's segments -- one run when its rows are back to back on both sides, gathers of
// k rows when the holes between rows are small enough to read through, else one row each.
void split_job(const CopyJob& j, size_t i, const PlanLimits& limits, std::vector<Segment>& segs) {
  const uint64_t cap = limits.staged_bytes;
  const uint64_t dst_row = j.dst_pitch();
  const bool identity = !j.convert;
  const bool contiguous =
      j.rows == 1 || (j.stride() == j.row_bytes && j.dst_pitch() == j.dst_row_bytes());
  if (contiguous) {
    segs.push_back({i, j.file, j.offset, 1, j.rows * j.row_bytes, j.row_bytes, 0,
                    identity && limits.direct_bytes > 0});
    return;
  }
  const uint64_t gap = j.stride() - j.row_bytes;
  const bool row_direct = identity && limits.direct_bytes > 0 && limits.direct_row_min > 0 &&
                          j.row_bytes >= limits.direct_row_min;
  if (!row_direct && j.exact && j.row_bytes <= cap) {
    // Packed: the holes are other ranks' rows, never read; k rows share one staging buffer.
    const uint64_t k = cap / j.row_bytes;
    for (uint64_t r = 0; r < j.rows; r += k) {
      const uint64_t n = std::min(k, j.rows - r);
      segs.push_back({i, j.file, j.offset + r * j.stride(), n, j.row_bytes, j.stride(), r * dst_row,
                      false, true});
    }
    return;
  }
  if (!row_direct && gap <= limits.merge_gap && j.row_bytes <= cap) {
    // Gather: read k rows (holes included) at once and pick the rows out of staging.
    const uint64_t k = std::max<uint64_t>(1, (cap - j.row_bytes) / j.stride() + 1);
    for (uint64_t r = 0; r < j.rows; r += k) {
      const uint64_t n = std::min(k, j.rows - r);
      segs.push_back(
          {i, j.file, j.offset + r * j.stride(), n, j.row_bytes, j.stride(), r * dst_row, false});
    }
    return;
  }
  for (uint64_t r = 0; r < j.rows; ++r) {
    segs.push_back({i, j.file, j.offset + r * j.stride(), 1, j.row_bytes, j.row_bytes, r * dst_row,
                    row_direct});
  }
}

// The segments of every job in (file, offset) order.
std::vector<Segment> sorted_segments(const std::vector<CopyJob>& jobs, const PlanLimits& limits) {
  std::vector<Segment> segs;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].rows == 0 || jobs[i].row_bytes == 0) continue;
    split_job(jobs[i], i, limits, segs);
  }
  std::stable_sort(segs.begin(), segs.end(), [](const Segment& a, const Segment& b) {
    return a.file != b.file ? a.file < b.file : a.offset < b.offset;
  });
  return segs;
}

// Step 3: segments into pieces. Keeps the piece being filled open while the next segment may
// join it: same file, a hole of at most merge_gap (never next to an exact job), within the
// staging size; direct pieces join only when both the file and the slot bytes continue.
class PieceBuilder {
 public:
  PieceBuilder(const std::vector<CopyJob>& jobs, const PlanLimits& limits)
      : jobs_(jobs), limits_(limits), cap_(limits.staged_bytes) {}

  void add(const Segment& s) {
    if (s.packed) return add_packed(s);
    s.rows > 1 ? add_gather(s) : add_run(s);
  }

  std::vector<Piece> finish() {
    flush();
    return std::move(pieces_);
  }

 private:
  // A gather segment stays whole; it joins an open staged piece if the hole is small and the
  // piece stays within the staging size.
  void add_gather(const Segment& s) {
    const CopyJob& j = jobs_[s.job];
    const uint64_t fp = s.footprint();
    const bool joins = open_ && !cur_.direct && cur_.extents.empty() && cur_.file == s.file &&
                       s.offset >= cur_.offset && may_reach(s.offset, j.exact) &&
                       std::max(cur_.offset + cur_.length, s.offset + fp) - cur_.offset <= cap_;
    if (!joins) start(s.file, s.offset, false, nullptr);
    cur_.parts.push_back(rows_part(s, j, s.offset - cur_.offset, s.stride));
    extend(s.offset + fp, j.exact);
  }

  // A strided job's rows as one part of the open piece: they start at `src` in the piece's bytes,
  // `src_pitch` apart (the file's stride, or the row size once packed back to back).
  static PiecePart rows_part(const Segment& s, const CopyJob& j, uint64_t src, uint64_t src_pitch) {
    PiecePart part;
    part.job = s.job;
    part.src = src;
    part.rows = s.rows;
    part.row_bytes = s.row_bytes;
    part.src_pitch = src_pitch;
    part.dst = static_cast<unsigned char*>(j.dst) + s.dst_off;
    part.dst_pitch = j.dst_pitch();
    part.dst_bytes = s.rows * j.dst_row_bytes();
    return part;
  }

  // One contiguous run, split into reads of at most the piece size.
  void add_run(const Segment& s) {
    const CopyJob& j = jobs_[s.job];
    auto* slot = static_cast<unsigned char*>(j.dst);
    uint64_t pos = 0;
    while (pos < s.row_bytes) {
      const uint64_t at = s.offset + pos;
      unsigned char* dst =
          slot + s.dst_off + (j.convert ? pos / j.unit * float_format_size(j.to) : pos);
      const uint64_t take = s.direct ? place_direct(s, at, dst, pos) : place_staged(s, j, at, pos);
      PiecePart part;
      part.job = s.job;
      part.src = at - cur_.offset;
      part.rows = 1;
      part.row_bytes = take;
      part.src_pitch = take;
      part.dst = dst;
      part.dst_bytes = j.convert ? take / j.unit * float_format_size(j.to) : take;
      part.dst_pitch = part.dst_bytes;
      cur_.parts.push_back(part);
      extend(at + take, j.exact);
      pos += take;
    }
  }

  // The bytes of a direct run that go into the open (or a new) direct piece from `at`.
  uint64_t place_direct(const Segment& s, uint64_t at, unsigned char* dst, uint64_t pos) {
    const bool joins = open_ && cur_.direct && cur_.file == s.file &&
                       at == cur_.offset + cur_.length && dst == cur_.direct_dst + cur_.length &&
                       cur_.length < limits_.direct_bytes;
    if (!joins) start(s.file, at, true, dst);
    return std::min(s.row_bytes - pos, limits_.direct_bytes - cur_.length);
  }

  // The bytes of a staged run that go into the open (or a new) staged piece from `at`: whole
  // elements, within the staging size.
  uint64_t place_staged(const Segment& s, const CopyJob& j, uint64_t at, uint64_t pos) {
    if (open_ && !cur_.direct && cur_.extents.empty() && cur_.file == s.file && at >= cur_.offset &&
        may_reach(at, j.exact)) {
      const uint64_t room = cap_ > at - cur_.offset ? cap_ - (at - cur_.offset) : 0;
      const uint64_t take = round_down(std::min(s.row_bytes - pos, room), j.unit);
      if (take > 0) return take;
    }
    start(s.file, at, false, nullptr);
    return round_down(std::min(s.row_bytes - pos, cap_), j.unit);
  }

  // Rows of an exact strided job: appended to the open packed piece of the same file while it
  // stays within the staging size, each row an extent (one that continues the last extends it).
  void add_packed(const Segment& s) {
    const CopyJob& j = jobs_[s.job];
    const uint64_t bytes = s.rows * s.row_bytes;
    const bool joins =
        open_ && !cur_.extents.empty() && cur_.file == s.file && cur_.length + bytes <= cap_;
    if (!joins) start(s.file, s.offset, false, nullptr);
    cur_.parts.push_back(rows_part(s, j, cur_.length, s.row_bytes));
    for (uint64_t r = 0; r < s.rows; ++r) {
      const uint64_t at = s.offset + r * s.stride;
      if (!cur_.extents.empty() && cur_.extents.back().offset + cur_.extents.back().length == at) {
        cur_.extents.back().length += s.row_bytes;
      } else {
        cur_.extents.push_back({at, s.row_bytes});
      }
    }
    cur_.length += bytes;
  }

  // Whether a staged read may run on from the open piece's end to `at`: a hole next to an exact
  // job is never read through (it holds other ranks' rows).
  bool may_reach(uint64_t at, bool exact) const {
    const uint64_t end = cur_.offset + cur_.length;
    return at <= end || (at <= end + limits_.merge_gap && !exact && !tail_exact_);
  }

  void extend(uint64_t end, bool exact) {
    if (end - cur_.offset >= cur_.length) tail_exact_ = exact;
    cur_.length = std::max(cur_.length, end - cur_.offset);
  }

  void flush() {
    if (open_) pieces_.push_back(std::move(cur_));
    cur_ = Piece();
    open_ = false;
  }

  void start(size_t file, uint64_t offset, bool direct, unsigned char* dst) {
    flush();
    cur_.file = file;
    cur_.offset = offset;
    cur_.length = 0;
    cur_.direct = direct;
    cur_.direct_dst = direct ? dst : nullptr;
    open_ = true;
    tail_exact_ = false;
  }

  const std::vector<CopyJob>& jobs_;
  const PlanLimits& limits_;
  const uint64_t cap_;
  std::vector<Piece> pieces_;
  Piece cur_;
  bool open_ = false;
  bool tail_exact_ = false;  // the bytes at the open piece's end belong to an exact job
};

}  // namespace

std::vector<Piece> plan_pieces(const std::vector<CopyJob>& jobs, const std::vector<PlanFile>& files,
                               const PlanLimits& limits) {
  check_jobs(jobs, files, limits.staged_bytes);
  PieceBuilder builder(jobs, limits);
  for (const Segment& s : sorted_segments(jobs, limits)) builder.add(s);
  return builder.finish();
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// How many descriptors one load keeps open at most: a quarter of the process's limit, at most
// 256 -- a checkpoint may have more shards than the process may open files, and the caller has
// descriptors of its own. Reads go in file order, so few files are in use at any moment.
size_t open_file_cap() {
  struct rlimit rl;
  uint64_t soft = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) soft = rl.rlim_cur;
  return static_cast<size_t>(std::clamp<uint64_t>(soft / 4, 1, 256));
}

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

// The files of one load. Each is opened and fstat'ed up front; afterwards at most
// open_file_cap() descriptors stay open (more only while that many readers hold distinct files):
// a read opens its file again when needed, and an idle file is closed, least recently used
// first, when the cap is reached. fstat when a file is opened again, before it is closed and at
// the end tells a file that changed underneath (rewritten, truncated, replaced) from one that
// did not.
class OpenFiles {
 public:
  OpenFiles(const std::vector<std::string>& paths,
            const std::function<int(const std::string&)>& open_descriptor)
      : paths_(paths),
        open_descriptor_(open_descriptor),
        cap_(open_file_cap()),
        fds_(paths.size()),
        users_(paths.size(), 0),
        stats_(paths.size()),
        idle_pos_(paths.size()) {
    try {
      for (size_t i = 0; i < paths_.size(); ++i) {
        stats_[i] = open_file(i, /*first=*/true);
        if (i >= cap_) close_file(i);
        if (fds_[i]) idle_pos_[i] = idle_.insert(idle_.end(), i);
      }
    } catch (...) {
      close_all();
      throw;
    }
  }
  ~OpenFiles() { close_all(); }
  OpenFiles(const OpenFiles&) = delete;
  OpenFiles& operator=(const OpenFiles&) = delete;

  // File i's descriptor, open until the Lease ends.
  class Lease {
   public:
    Lease(OpenFiles& files, size_t i) : files_(files), i_(i), fd_(files.acquire(i)) {}
    ~Lease() { files_.release(i_); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    int fd() const { return fd_; }

   private:
    OpenFiles& files_;
    size_t i_;
    int fd_;
  };

  const std::string& path(size_t i) const { return paths_[i]; }
  size_t size() const { return paths_.size(); }
  std::vector<PlanFile> plan_files() const {
    std::vector<PlanFile> out;
    for (size_t i = 0; i < paths_.size(); ++i) {
      out.push_back({paths_[i], static_cast<uint64_t>(stats_[i].st_size)});
    }
    return out;
  }

  // The files still open (those closed were checked when they closed).
  void check_unchanged() {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < fds_.size(); ++i) {
      if (fds_[i]) check(i, "after reading");
    }
  }

 private:
  // Opens file i (without blocking: a FIFO put in a shard's place must not hang the load);
  // returns its fstat. first: its identity is not known yet.
  struct stat open_file(size_t i, bool first) {
    const std::string& p = paths_[i];
    UniqueFd fd(first ? duplicate(p) : -1);
    if (!fd) fd.reset(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!fd && (errno == EMFILE || errno == ENFILE) && close_idle()) {
      fd.reset(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    }
    if (!fd) {
      const int e = errno;
      throw ReadError(p + ": cannot open: " + std::strerror(e) +
                      (e == EMFILE ? " (the load keeps at most " + std::to_string(cap_) +
                                         " files open; other descriptors of the process fill "
                                         "its limit)"
                                   : std::string()));
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) {
      throw ReadError(p + ": cannot stat: " + std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) throw ReadError(p + ": is not a regular file");
    if (!first && !same_file(st, stats_[i])) throw changed(i, st);
    ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
    // Doubles the kernel's readahead for a cold file; harmless when it is cached.
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    fds_[i] = std::move(fd);
    ++open_;
    return st;
  }

  // A duplicate of the descriptor the caller holds open on `p`, or -1.
  int duplicate(const std::string& p) const {
    const int held = open_descriptor_ ? open_descriptor_(p) : -1;
    return held < 0 ? -1 : ::fcntl(held, F_DUPFD_CLOEXEC, 0);
  }

  ReadError changed(size_t i, const struct stat& now) const {
    const struct stat& was = stats_[i];
    const bool replaced = now.st_dev != was.st_dev || now.st_ino != was.st_ino;
    return ReadError(paths_[i] + ": file " + (replaced ? "replaced" : "changed") +
                     " during the load (size " + std::to_string(was.st_size) + " -> " +
                     std::to_string(now.st_size) + "); the bytes read may mix two versions");
  }

  void check(size_t i, const char* when) const {
    struct stat now;
    if (::fstat(fds_[i].get(), &now) != 0) {
      throw ReadError(paths_[i] + ": cannot stat " + when + ": " + std::strerror(errno));
    }
    if (!same_file(now, stats_[i])) throw changed(i, now);
  }

  void close_file(size_t i) {
    fds_[i].reset();
    --open_;
  }

  void close_all() {
    for (size_t i = 0; i < fds_.size(); ++i) {
      if (fds_[i]) close_file(i);
    }
  }

  // Closes the least recently used idle file (checked first); false when none is idle.
  bool close_idle() {
    if (idle_.empty()) return false;
    const size_t victim = idle_.front();
    idle_.pop_front();
    check(victim, "before closing it");
    close_file(victim);
    return true;
  }

  int acquire(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fds_[i]) {
      while (open_ >= cap_ && close_idle()) {
      }
      open_file(i, /*first=*/false);
    } else if (users_[i] == 0) {
      idle_.erase(idle_pos_[i]);
    }
    ++users_[i];
    return fds_[i].get();
  }

  void release(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    if (--users_[i] == 0) idle_pos_[i] = idle_.insert(idle_.end(), i);
  }

  std::vector<std::string> paths_;
  std::function<int(const std::string&)> open_descriptor_;
  size_t cap_;
  std::mutex mu_;
  std::vector<UniqueFd> fds_;       // invalid while closed
  std::vector<uint32_t> users_;     // leases held
  std::vector<struct stat> stats_;  // at the first open
  std::list<size_t> idle_;          // open, no lease, least recently used first
  std::vector<std::list<size_t>::iterator> idle_pos_;
  size_t open_ = 0;
};

// Fresh 4 KiB slot pages faulted in before a read of at least 64 KiB (slots.h).
void prefault(void* p, uint64_t n) {
  if (n >= (64u << 10)) populate_pages(p, n);
}

// State shared by the reader threads of one run.
class Run : public ProgressRun {
 public:
  Run(const EngineOptions& o, const std::vector<CopyJob>& jobs, const std::vector<Piece>& pieces,
      OpenFiles& files)
      : ProgressRun(o, 0),
        jobs(jobs),
        pieces(pieces),
        files(files),
        job_filled(new std::atomic<uint64_t>[jobs.size()]),
        file_bytes(new std::atomic<uint64_t>[files.size()]),
        file_first(new std::atomic<int64_t>[files.size()]),
        file_last(new std::atomic<int64_t>[files.size()]) {
    for (size_t i = 0; i < jobs.size(); ++i) job_filled[i] = 0;
    for (size_t i = 0; i < files.size(); ++i) {
      file_bytes[i] = 0;
      file_first[i] = INT64_MAX;
      file_last[i] = 0;
    }
    for (const Piece& p : pieces) total += p.length;
  }

  const std::vector<CopyJob>& jobs;
  const std::vector<Piece>& pieces;
  OpenFiles& files;

  std::atomic<size_t> next{0};
  std::atomic<uint64_t> reads{0}, direct{0};
  std::unique_ptr<std::atomic<uint64_t>[]> job_filled;
  std::unique_ptr<std::atomic<uint64_t>[]> file_bytes;
  std::unique_ptr<std::atomic<int64_t>[]> file_first, file_last;
  std::atomic<uint64_t> staging_live{0}, staging_peak{0}, device_staging{0};

  int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                t0)
        .count();
  }

  void staging_add(uint64_t n) {
    const uint64_t live = staging_live += n;
    uint64_t peak = staging_peak.load();
    while (live > peak && !staging_peak.compare_exchange_weak(peak, live)) {
    }
  }

  std::string piece_names(const Piece& p) const {
    std::vector<size_t> ids;
    for (const PiecePart& part : p.parts) ids.push_back(part.job);
    std::sort(ids.begin(), ids.end());
    const size_t distinct = std::unique(ids.begin(), ids.end()) - ids.begin();
    std::string s = describe_job(jobs[p.parts.front().job]);
    if (distinct > 1) s += " and " + std::to_string(distinct - 1) + " more";
    return s;
  }

  // Reads the whole piece into buf (short reads resumed, EINTR retried): its one range, or its
  // extents back to back.
  void read_piece(size_t index, unsigned char* buf) {
    const Piece& p = pieces[index];
    const int64_t start = now_ns();
    const OpenFiles::Lease file(files, p.file);
    if (p.extents.empty()) {
      read_range(p, file.fd(), buf, p.offset, p.length);
    } else {
      uint64_t at = 0;
      for (const Extent& e : p.extents) {
        read_range(p, file.fd(), buf + at, e.offset, e.length);
        at += e.length;
      }
    }
    count_read(index, start);
  }

  // A direct piece's fresh slot pages filled from the page cache (page_copy.h), a chunk at a
  // time: each chunk's file pages leave this process's page tables once copied (they stay in
  // the page cache), so peak RSS counts the slots plus at most a chunk of the file per thread,
  // as reads do, not a whole piece (16 MiB) per thread.
  void copy_piece(size_t index, PageCopier& copier, const unsigned char* map) {
    constexpr uint64_t kChunk = uint64_t{1} << 20, kPage = 4096, kFolio = uint64_t{2} << 20;
    const Piece& p = pieces[index];
    const int64_t start = now_ns();
    const OpenFiles::Lease file(files, p.file);
    for (uint64_t at = 0; at < p.length;) {
      uint64_t len = std::min(p.length - at, kChunk);
      const uintptr_t end = reinterpret_cast<uintptr_t>(p.direct_dst + at) + len;
      if (at + len < p.length) len -= end % kPage;  // no slot page split between two chunks
      if (!copier.fill(p.direct_dst + at, {file.fd(), map, p.offset + at}, len)) {
        throw ReadError(files.path(p.file) + ": " + std::to_string(p.length) + " bytes at offset " +
                        std::to_string(p.offset) + " could not be read into their slot (" +
                        piece_names(p) + "): the file is shorter than when the load began");
      }
      // From the 2 MiB boundary before the chunk (never before the mapping: the memory below it
      // is another mapping's): a large page-cache folio is mapped whole on a fault, so the
      // chunk's first fault maps again the tail of the folio the last chunk dropped.
      const uintptr_t a =
          std::max((reinterpret_cast<uintptr_t>(map) + p.offset + at) & ~(kFolio - 1),
                   reinterpret_cast<uintptr_t>(map));
      const uintptr_t b = reinterpret_cast<uintptr_t>(map) + p.offset + at + len;
      ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
      at += len;
    }
    reads.fetch_add(1, std::memory_order_relaxed);  // one read of the file's range, as a pread
    count_read(index, start);
  }

  void count_read(size_t index, int64_t start) {
    const Piece& p = pieces[index];
    const int64_t end = now_ns();
    file_bytes[p.file] += p.length;
    int64_t v = file_first[p.file].load();
    while (start < v && !file_first[p.file].compare_exchange_weak(v, start)) {
    }
    v = file_last[p.file].load();
    while (end > v && !file_last[p.file].compare_exchange_weak(v, end)) {
    }
    if (opt.hooks.after_read) opt.hooks.after_read(index);
  }

  // [offset, offset + length) of piece p's file into buf.
  void read_range(const Piece& p, int fd, unsigned char* buf, uint64_t offset, uint64_t length) {
    uint64_t got = 0;
    while (got < length) {
      const size_t want = static_cast<size_t>(length - got);
      const uint64_t off = offset + got;
      const ssize_t r = opt.hooks.pread ? opt.hooks.pread(fd, buf + got, want, off)
                                        : ::pread(fd, buf + got, want, off);
      reads.fetch_add(1, std::memory_order_relaxed);
      if (r < 0) {
        const int e = errno;
        if (e == EINTR) continue;
        throw ReadError(files.path(p.file) + ": read of " + std::to_string(want) +
                        " bytes at offset " + std::to_string(off) + " failed (" + piece_names(p) +
                        "): " + std::strerror(e));
      }
      if (r == 0) {
        throw ReadError(files.path(p.file) + ": unexpected end of file at offset " +
                        std::to_string(off) + " while reading " + piece_names(p) + " (bytes [" +
                        std::to_string(offset) + ", " + std::to_string(offset + length) +
                        ")); the file was truncated");
      }
      got += static_cast<uint64_t>(r);
    }
  }

  void delivered(const Piece& p) {
    for (const PiecePart& part : p.parts) job_filled[part.job] += part.dst_bytes;
    done += p.length;
  }

  // Every slot got exactly its bytes, and no file changed underneath.
  void verify() {
    if (opt.hooks.before_verify) opt.hooks.before_verify();
    for (size_t i = 0; i < jobs.size(); ++i) {
      const uint64_t want = jobs[i].dst_bytes();
      if (job_filled[i] != want) {
        throw VerifyError(describe_job(jobs[i]) + ": slot received " +
                          std::to_string(job_filled[i].load()) + " of its " + std::to_string(want) +
                          " bytes");
      }
    }
    files.check_unchanged();
  }

  LoadReport report(const std::string& engine, int threads) const {
    LoadReport r;
    r.bytes = done;
    for (const CopyJob& j : jobs) r.slot_bytes += j.dst_bytes();
    r.seconds = seconds_since(t0);
    r.peak_staging_bytes = staging_peak;
    r.peak_device_staging_bytes = device_staging;
    r.reads = reads;
    r.direct_bytes = direct;
    r.threads = threads;
    r.engine = engine;
    for (size_t i = 0; i < files.size(); ++i) {
      FileReport f;
      f.path = files.path(i);
      f.bytes = file_bytes[i];
      const int64_t a = file_first[i], b = file_last[i];
      f.seconds = b > a ? (b - a) / 1e9 : 0;
      r.files.push_back(f);
    }
    return r;
  }
};

struct FreeDeleter {
  void operator()(unsigned char* p) const { std::free(p); }
};

uint64_t max_staged_length(const std::vector<Piece>& pieces) {
  uint64_t m = 0;
  for (const Piece& p : pieces) {
    if (!p.direct) m = std::max(m, p.length);
  }
  return m;
}

void deliver_on_cpu(const PiecePart& part, const CopyJob& job, const unsigned char* buf,
                    bool fault_first) {
  if (fault_first)
    prefault(part.dst, (part.rows - 1) * part.dst_pitch + part.dst_bytes / part.rows);
  const unsigned char* src = buf + part.src;
  if (job.convert) {
    convert_cpu_2d(src, part.src_pitch, job.from, part.dst, part.dst_pitch, job.to, part.rows,
                   part.row_bytes / job.unit);
  } else {
    for (uint64_t r = 0; r < part.rows; ++r) {
      std::memcpy(part.dst + r * part.dst_pitch, src + r * part.src_pitch, part.row_bytes);
    }
  }
}

}  // namespace

std::string load_report_json(const LoadReport& r) {
  nlohmann::json files = nlohmann::json::array();
  for (const FileReport& f : r.files) {
    files.push_back({{"path", f.path}, {"bytes", f.bytes}, {"seconds", f.seconds}});
  }
  return nlohmann::json{{"bytes", r.bytes},
                        {"slot_bytes", r.slot_bytes},
                        {"seconds", r.seconds},
                        {"peak_staging_bytes", r.peak_staging_bytes},
                        {"peak_device_staging_bytes", r.peak_device_staging_bytes},
                        {"reads", r.reads},
                        {"direct_bytes", r.direct_bytes},
                        {"mapped_bytes", r.mapped_bytes},
                        {"threads", r.threads},
                        {"engine", r.engine},
                        {"files", std::move(files)},
                        {"dequantized_keys", r.dequantized},
                        {"missing_keys", r.missing},
                        {"unexpected_keys", r.unexpected}}
      .dump();
}

namespace {

// Fresh slot pages filled from the page cache (page_copy.h) instead of zeroed and then read:
// where the caller names the fresh arena every piece writes into as it is read (no staging, no
// extents), slot pages are 4 KiB ones pre-faulted (on huge pages the read is faster still), no
// test hook watches the reads, and copies_slot_pages (slots.h) says so.
struct PageFill {
  struct Map {
    void* base = MAP_FAILED;
    uint64_t size = 0;
    ~Map() {
      if (base != MAP_FAILED) ::munmap(base, size);
    }
    const unsigned char* data() const { return static_cast<const unsigned char*>(base); }
  };
  std::vector<Map> maps;  // per file, read-only and shared
  std::unique_ptr<PageCopier> copier;
};

bool copies_pages(const EngineOptions& opt, const std::vector<Piece>& pieces) {
  if (!copies_slot_pages(opt) || opt.fresh_slots == nullptr || opt.hooks.pread ||
      opt.hooks.after_read) {
    return false;
  }
  const auto* lo = static_cast<const unsigned char*>(opt.fresh_slots);
  for (const Piece& p : pieces) {
    if (!p.direct || !p.extents.empty() || p.direct_dst < lo ||
        p.direct_dst + p.length > lo + opt.fresh_slot_bytes) {
      return false;
    }
  }
  return !pieces.empty();
}

PageFill page_fill(const EngineOptions& opt, const std::vector<Piece>& pieces, OpenFiles& files) {
  PageFill fill;
  if (!copies_pages(opt, pieces)) return fill;
  const std::vector<PlanFile> plan = files.plan_files();
  fill.maps.resize(plan.size());
  for (size_t f = 0; f < plan.size(); ++f) {
    if (plan[f].size == 0) continue;
    const OpenFiles::Lease file(files, f);
    fill.maps[f].base = ::mmap(nullptr, plan[f].size, PROT_READ, MAP_SHARED, file.fd(), 0);
    if (fill.maps[f].base == MAP_FAILED) return PageFill{};
    fill.maps[f].size = plan[f].size;
  }
  fill.copier = PageCopier::open(opt.fresh_slots, opt.fresh_slot_bytes);
  return fill;
}

}  // namespace

LoadReport run_cpu_engine(const std::vector<std::string>& paths, const std::vector<CopyJob>& jobs,
                          const EngineOptions& opt) {
  OpenFiles files(paths, opt.open_descriptor);
  const int threads = resolve_threads(opt.threads);
  if (opt.chunk_bytes == 0) throw PlanError("chunk_bytes must be positive");
  check_staging(jobs, opt.staging_bytes, threads, "reader threads");
  PlanLimits limits;
  limits.direct_bytes = opt.chunk_bytes;
  limits.staged_bytes = std::min<uint64_t>(opt.chunk_bytes, opt.staging_bytes / threads);
  limits.merge_gap = opt.merge_gap;
  limits.direct_row_min = opt.direct_row_min;
  const std::vector<Piece> pieces = plan_pieces(jobs, files.plan_files(), limits);
  const uint64_t staging_size = max_staged_length(pieces);

  const bool fault_first = resolve_slot_pages(opt.slot_pages) == SlotPages::kSmall;
  const PageFill fill = page_fill(opt, pieces, files);
  Run run(opt, jobs, pieces, files);
  const int used = std::max(1, std::min<int>(threads, static_cast<int>(pieces.size())));
  run.execute(used, [&](int) {
    // Each reader owns one staging buffer, made on its first staged piece.
    std::unique_ptr<unsigned char, FreeDeleter> staging;
    struct Release {
      Run& run;
      uint64_t bytes = 0;
      ~Release() { run.staging_live -= bytes; }
    } release{run};
    for (;;) {
      if (run.should_stop()) return;
      const size_t i = run.next.fetch_add(1);
      if (i >= pieces.size()) return;
      const Piece& p = pieces[i];
      if (p.direct && fill.copier) {
        run.copy_piece(i, *fill.copier, fill.maps[p.file].data());
        run.direct += p.length;
      } else if (p.direct) {
        if (fault_first) prefault(p.direct_dst, p.length);
        run.read_piece(i, p.direct_dst);
        run.direct += p.length;
      } else {
        if (!staging) {
          staging.reset(static_cast<unsigned char*>(
              std::aligned_alloc(4096, (staging_size + 4095) / 4096 * 4096)));
          if (!staging) throw std::bad_alloc();
          release.bytes = staging_size;
          run.staging_add(staging_size);
        }
        run.read_piece(i, staging.get());
        for (const PiecePart& part : p.parts) {
          deliver_on_cpu(part, jobs[part.job], staging.get(), fault_first);
        }
      }
      run.delivered(p);
    }
  });
  if (run.error) std::rethrow_exception(run.error);
  run.verify();
  return run.report("cpu", used);
}

namespace {

// The staged engine's ring: pinned buffers handed out oldest-first, so a reader usually gets one
// whose copies have finished.
struct RingBuffer {
  unsigned char* host = nullptr;
  unsigned char* scratch = nullptr;  // device copy of the piece, for conversions
  DeviceOps::Event event = nullptr;
  DeviceOps::Stream stream = nullptr;
  bool pending = false;
};

class Ring {
 public:
  Ring(DeviceOps& dev, int buffers, int streams, uint64_t size) : dev_(dev), size_(size) {
    try {
      for (int s = 0; s < streams; ++s) streams_.push_back(dev.create_stream());
      for (int b = 0; b < buffers; ++b) {
        RingBuffer rb;
        rb.stream = streams_[b % streams];
        bufs_.push_back(rb);
        bufs_.back().event = dev.create_event();
        bufs_.back().host = static_cast<unsigned char*>(dev.alloc_pinned(size));
        free_.push_back(b);
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~Ring() { release(); }

  // Blocks until a buffer is free or the run stops (-1).
  int acquire(Run& run) {
    std::unique_lock<std::mutex> lock(mu_);
    // Timed: a cancel noticed by the progress loop sets run.stop without waking this cv.
    while (free_.empty() && !run.stop.load()) cv_.wait_for(lock, std::chrono::milliseconds(20));
    if (free_.empty() || run.stop.load()) return -1;
    const int b = free_.front();
    free_.pop_front();
    return b;
  }
  void give_back(int b) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(b);
    }
    cv_.notify_one();
  }
  void wake_all() { cv_.notify_all(); }
  RingBuffer& buffer(int b) { return bufs_[b]; }
  uint64_t size() const { return size_; }
  uint64_t pinned_bytes() const { return size_ * bufs_.size(); }

  // Waits for every stream (the first failure is returned, not thrown: cleanup must go on).
  std::exception_ptr drain() {
    std::exception_ptr first;
    for (DeviceOps::Stream s : streams_) {
      try {
        dev_.synchronize(s);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    return first;
  }

 private:
  void release() {
    drain();
    for (RingBuffer& rb : bufs_) {
      if (rb.host) dev_.free_pinned(rb.host);
      if (rb.scratch) dev_.free_device(rb.scratch);
      if (rb.event) dev_.destroy_event(rb.event);
    }
    bufs_.clear();
    for (DeviceOps::Stream s : streams_) dev_.destroy_stream(s);
    streams_.clear();
  }

  DeviceOps& dev_;
  uint64_t size_;
  std::vector<DeviceOps::Stream> streams_;
  std::vector<RingBuffer> bufs_;
  std::deque<int> free_;
  std::mutex mu_;
  std::condition_variable cv_;
};

// Queues one piece's copies (and conversions) from its ring buffer.
void deliver_on_device(DeviceOps& dev, Run& run, const Piece& p, RingBuffer& rb, uint64_t size) {
  bool converts = false;
  for (const PiecePart& part : p.parts) converts |= run.jobs[part.job].convert;
  if (converts) {
    if (rb.scratch == nullptr) {
      rb.scratch = static_cast<unsigned char*>(dev.alloc_device(size));
      run.device_staging += size;
    }
    dev.copy_to_device_2d(rb.scratch, p.length, rb.host, p.length, p.length, 1, rb.stream);
  }
  for (size_t i = 0; i < p.parts.size(); ++i) {
    const PiecePart& part = p.parts[i];
    const CopyJob& job = run.jobs[part.job];
    if (job.convert) {
      dev.convert_2d(rb.scratch + part.src, part.src_pitch, job.from, part.dst, part.dst_pitch,
                     job.to, part.rows, part.row_bytes / job.unit, rb.stream);
      continue;
    }
    // Neighbouring single-row parts that are adjacent on both sides go as one copy.
    uint64_t width = part.row_bytes;
    if (part.rows == 1) {
      while (i + 1 < p.parts.size()) {
        const PiecePart& nx = p.parts[i + 1];
        if (nx.rows != 1 || run.jobs[nx.job].convert || nx.src != part.src + width ||
            nx.dst != part.dst + width) {
          break;
        }
        width += nx.row_bytes;
        ++i;
      }
    }
    dev.copy_to_device_2d(part.dst, part.rows == 1 ? width : part.dst_pitch, rb.host + part.src,
                          part.rows == 1 ? width : part.src_pitch, width, part.rows, rb.stream);
  }
}

}  // namespace

LoadReport run_staged_engine(const std::vector<std::string>& paths,
                             const std::vector<CopyJob>& jobs, DeviceOps& dev,
                             const EngineOptions& opt) {
  OpenFiles files(paths, opt.open_descriptor);
  const int threads = resolve_threads(opt.threads);
  if (opt.ring_buffers < 1) throw PlanError("ring_buffers must be at least 1");
  // Copies overlap only across streams, and each ring buffer's copies go to one stream: fewer
  // than 2 streams, or fewer buffers than streams, would serialise them.
  if (opt.streams < 2) {
    throw PlanError("streams must be at least 2 (copies overlap across streams), got " +
                    std::to_string(opt.streams));
  }
  if (opt.ring_buffers < opt.streams) {
    throw PlanError("ring_buffers (" + std::to_string(opt.ring_buffers) +
                    ") must be at least streams (" + std::to_string(opt.streams) +
                    "): each buffer copies on one stream");
  }
  if (opt.chunk_bytes == 0) throw PlanError("chunk_bytes must be positive");
  check_staging(jobs, opt.staging_bytes, opt.ring_buffers, "ring buffers");
  const uint64_t buffer = std::min<uint64_t>(opt.chunk_bytes, opt.staging_bytes / opt.ring_buffers);
  PlanLimits limits;
  limits.staged_bytes = buffer;
  limits.merge_gap = opt.merge_gap;
  const std::vector<Piece> pieces = plan_pieces(jobs, files.plan_files(), limits);

  dev.bind_thread();
  Run run(opt, jobs, pieces, files);
  const uint64_t ring_size = std::max<uint64_t>(max_staged_length(pieces), 1);
  const int buffers =
      static_cast<int>(std::max<size_t>(1, std::min<size_t>(opt.ring_buffers, pieces.size())));
  const int used = std::max(1, std::min<int>(threads, static_cast<int>(pieces.size())));
  {
    Ring ring(dev, buffers, opt.streams, ring_size);
    run.staging_add(ring.pinned_bytes());
    run.execute(used, [&](int) {
      dev.bind_thread();
      for (;;) {
        if (run.should_stop()) break;
        const size_t i = run.next.fetch_add(1);
        if (i >= pieces.size()) break;
        const int b = ring.acquire(run);
        if (b < 0) break;
        RingBuffer& rb = ring.buffer(b);
        try {
          // The buffer's previous copies must be done before it is overwritten.
          if (rb.pending) dev.wait(rb.event);
          rb.pending = false;
          run.read_piece(i, rb.host);
          deliver_on_device(dev, run, pieces[i], rb, ring.size());
          dev.record(rb.event, rb.stream);
          rb.pending = true;
        } catch (...) {
          ring.give_back(b);
          ring.wake_all();
          throw;
        }
        ring.give_back(b);
        run.delivered(pieces[i]);
      }
      ring.wake_all();  // a reader waiting for a buffer must see the end
    });
    // Every queued copy must finish (or fail) before the ring's memory goes away.
    std::exception_ptr device_error = ring.drain();
    if (!run.error && device_error) run.error = device_error;
  }
  run.staging_live = 0;
  if (run.error) std::rethrow_exception(run.error);
  run.verify();
  return run.report("staged:" + dev.name(), used);
}

}  // namespace metaload
