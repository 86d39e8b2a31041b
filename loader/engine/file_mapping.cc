#include "loader/engine/file_mapping.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "base/unique_fd.h"

namespace metaload {

namespace {

std::atomic<int64_t> g_mappings{0};
std::atomic<int64_t> g_detached{0};

// The signal a breaking lease sends (fcntl F_SETSIG). Its default action is to ignore it, so one
// sent to the whole process in the instant between F_SETLEASE and F_SETOWN_EX (which points it at
// the watcher thread, the only thread that blocks it) does no harm; the watcher's periodic scan
// finds that break instead.
constexpr int kLeaseSignal = SIGURG;

// --- the SIGBUS report -------------------------------------------------------------------------
// A table the handler reads without locks: which file each mapped range holds. Static storage,
// so it outlives every mapping and is there during static destruction.
constexpr int kSignalSlots = 1024;
constexpr size_t kSignalPathBytes = 496;
struct SignalSlot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  char path[kSignalPathBytes];
};
SignalSlot g_signal_slots[kSignalSlots];
struct sigaction g_previous_sigbus;

void put(char*& at, char* end, const char* s) {
  while (*s && at < end) *at++ = *s++;
}

void put_number(char*& at, char* end, uint64_t v) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0 && at < end) *at++ = digits[--n];
}

// A view's file-mapped run: where it lies, the file byte at `begin`, and the g_signal_slots entry
// naming its file (-1: none).
constexpr int kSegmentSlots = 1 << 16;
struct SegmentSlot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  uint64_t file_offset = 0;
  int path_slot = 0;
};
SegmentSlot g_segment_slots[kSegmentSlots];
int g_next_segment_slot = 0;  // where the next claim starts looking (the registry's mutex)

// Async-signal-safe: write(2).
void report_sigbus(const char* path, uint64_t byte) {
  char msg[kSignalPathBytes + 512];
  char* at = msg;
  char* last = msg + sizeof msg - 1;
  put(at, last, "metaload: SIGBUS reading ");
  put(at, last, path);
  put(at, last, " at byte ");
  put_number(at, last, byte);
  put(at, last,
      ", mapped zero-copy: the file was truncated, or its storage failed, while tensors used "
      "it. Replace checkpoint files by rename; never truncate or rewrite them in place "
      "(metaload README, Reliability).\n");
  ssize_t ignored = ::write(STDERR_FILENO, msg, static_cast<size_t>(at - msg));
  (void)ignored;
}

// Whether `addr` lies in a mapping or a view's run the tables name; then reports it.
bool report_mapped_sigbus(uintptr_t addr) {
  for (SignalSlot& s : g_signal_slots) {
    const uintptr_t begin = s.begin.load(std::memory_order_acquire);
    const uintptr_t end = s.end.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin || addr >= end) continue;
    report_sigbus(s.path, addr - begin);
    return true;
  }
  for (SegmentSlot& s : g_segment_slots) {
    const uintptr_t begin = s.begin.load(std::memory_order_acquire);
    const uintptr_t end = s.end.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin || addr >= end) continue;
    const int p = s.path_slot;
    report_sigbus(p >= 0 ? g_signal_slots[p].path : "a checkpoint file",
                  s.file_offset + addr - begin);
    return true;
  }
  return false;
}

// Async-signal-safe: table reads, write(2), sigaction(2), raise(3).
void on_sigbus(int sig, siginfo_t* info, void* context) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
  // Once: a previous handler that returns would bring the same fault back here.
  static std::atomic<bool> reported{false};
  if (!reported.load() && report_mapped_sigbus(addr)) reported = true;
  // Then whatever would have happened without this handler. (An ignored SIGBUS is no option for
  // a fault: the kernel applies the default action to it.)
  const struct sigaction& prev = g_previous_sigbus;
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    if (prev.sa_flags & SA_SIGINFO) {
      prev.sa_sigaction(sig, info, context);
    } else {
      prev.sa_handler(sig);
    }
    return;
  }
  // The default action: on return the faulting access runs again and the process dies of SIGBUS
  // (a core where enabled); a SIGBUS someone sent is sent again.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGBUS, &dfl, nullptr);
  if (info == nullptr || info->si_code <= 0) ::raise(SIGBUS);
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = &on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
}

int claim_signal_slot(const std::string& path, const unsigned char* data, uint64_t size) {
  for (int i = 0; i < kSignalSlots; ++i) {
    SignalSlot& s = g_signal_slots[i];
    if (s.begin.load(std::memory_order_relaxed) != 0) continue;
    const size_t n = std::min(path.size(), kSignalPathBytes - 1);
    std::memcpy(s.path, path.data(), n);
    s.path[n] = '\0';
    s.end.store(reinterpret_cast<uintptr_t>(data) + size, std::memory_order_release);
    s.begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
    return i;
  }
  return -1;  // more than kSignalSlots live mappings: a SIGBUS in them is reported unnamed
}

// The registry's mutex held.
int claim_segment_slot(uintptr_t begin, uintptr_t end, uint64_t file_offset, int path_slot) {
  for (int n = 0; n < kSegmentSlots; ++n) {
    const int i = (g_next_segment_slot + n) % kSegmentSlots;
    SegmentSlot& s = g_segment_slots[i];
    if (s.begin.load(std::memory_order_relaxed) != 0) continue;
    s.file_offset = file_offset;
    s.path_slot = path_slot;
    s.end.store(end, std::memory_order_release);
    s.begin.store(begin, std::memory_order_release);
    g_next_segment_slot = (i + 1) % kSegmentSlots;
    return i;
  }
  return -1;  // a SIGBUS there is reported unnamed
}

void release_segment_slot(int i) {
  g_segment_slots[i].begin.store(0, std::memory_order_release);
  g_segment_slots[i].end.store(0, std::memory_order_release);
}

// Mapped files this process may hold open: a quarter of its open-file limit.
int64_t held_file_budget() {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 1 << 16;
  return static_cast<int64_t>(rl.rlim_cur / 4);
}

std::string errno_text(int err) {
  return std::strerror(err);
}

}  // namespace

// Every live mapping (by address), the leased ones, and the watcher thread that detaches a mapping
// when its lease breaks. Allocated once and never destroyed: the watcher runs until the process
// ends, through static destruction.
struct FileMapping::Registry {
  std::mutex mu;  // guards the maps, every mapping's fd_ and views_, and detaching
  // Every mapping's and view's bytes: where they start, how many, whose file.
  struct Live {
    std::weak_ptr<FileMapping> map;
    uint64_t bytes = 0;
  };
  std::map<uintptr_t, Live> live;
  std::vector<FileMapping*> leased;
  std::atomic<int64_t> held_files{0};
  // The watcher: started on the first lease (again in a forked child, which has no threads but
  // the forking one); its thread id receives the lease signals.
  std::mutex start_mu;
  std::condition_variable started;
  pid_t pid = 0;  // the process that started it
  pid_t tid = 0;

  static Registry& get() {
    static Registry* r = [] {
      auto* made = new Registry();
      ::pthread_atfork(&before_fork, &after_fork_in_parent, &after_fork_in_child);
      return made;
    }();
    return *r;
  }

  // Nothing of ours is half-changed across a fork.
  static void before_fork() {
    get().start_mu.lock();
    get().mu.lock();
  }
  static void after_fork_in_parent() {
    get().mu.unlock();
    get().start_mu.unlock();
  }
  // The child's copies of leased mappings are not what the parent's watcher detaches (and the
  // lease, shared with the parent, is the parent's): the child checks them instead.
  static void after_fork_in_child() {
    Registry& r = get();
    for (FileMapping* m : r.leased) m->guard_ = MappingGuard::kChecked;
    r.leased.clear();
    r.mu.unlock();
    r.start_mu.unlock();
  }

  pid_t watcher() {
    std::unique_lock<std::mutex> g(start_mu);
    if (pid != ::getpid()) {
      pid = ::getpid();
      tid = 0;
      std::thread([this] { watch(); }).detach();
      started.wait(g, [this] { return tid != 0; });
    }
    return tid;
  }

  void watch() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, kLeaseSignal);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    {
      std::lock_guard<std::mutex> g(start_mu);
      tid = static_cast<pid_t>(::syscall(SYS_gettid));
    }
    started.notify_all();
    for (;;) {
      bool any;
      {
        std::lock_guard<std::mutex> g(mu);
        any = !leased.empty();
      }
      siginfo_t info;
      if (any) {
        // Woken by a break, or after a second to catch a break whose signal went astray.
        const struct timespec second = {1, 0};
        ::sigtimedwait(&set, &info, &second);
      } else {
        ::sigwaitinfo(&set, &info);  // FileMapping::open wakes it for the first lease
      }
      std::lock_guard<std::mutex> g(mu);
      for (size_t i = 0; i < leased.size();) {
        FileMapping* m = leased[i];
        // F_RDLCK while held; F_UNLCK once a writer or truncate asked for the file.
        if (::fcntl(m->fd_, F_GETLEASE) == F_RDLCK) {
          ++i;
          continue;
        }
        m->detach_locked();  // removes it from `leased`
      }
    }
  }
};

const char* mapping_guard_name(MappingGuard g) {
  switch (g) {
    case MappingGuard::kLease:
      return "lease";
    case MappingGuard::kChecked:
      return "checked";
    case MappingGuard::kDetached:
      return "detached";
  }
  return "?";
}

std::shared_ptr<FileMapping> FileMapping::open(const std::string& path, uint64_t expected_size,
                                               int held_fd) {
  install_sigbus_handler();
  UniqueFd fd(held_fd >= 0 ? ::fcntl(held_fd, F_DUPFD_CLOEXEC, 0) : -1);
  if (held_fd < 0) fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw ReadError(path + ": cannot open for mapping: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != expected_size) {
    const int err = errno;
    throw ReadError(path + ": the file changed since its header was read (size " +
                    std::to_string(static_cast<uint64_t>(st.st_size)) + ", expected " +
                    std::to_string(expected_size) + ")" +
                    (err ? std::string(": ") + errno_text(err) : ""));
  }
  void* base = expected_size == 0 ? nullptr
                                  : ::mmap(nullptr, expected_size, PROT_READ | PROT_WRITE,
                                           MAP_PRIVATE, fd.get(), 0);
  if (base == MAP_FAILED) throw ReadError(path + ": cannot map: " + errno_text(errno));
  Registry& r = Registry::get();
  // The descriptor stays open while mapped (a lease lives on it, and fstat sees the mapped inode
  // even after a rename), within the budget.
  int held = -1;
  if (expected_size > 0 && r.held_files.fetch_add(1) < held_file_budget()) {
    held = fd.release();  // the FileMapping owns it from here (its destructor ends the lease)
  } else {
    if (expected_size > 0) --r.held_files;
    fd.reset();  // the mapping keeps the file
  }
  std::shared_ptr<FileMapping> m(
      new FileMapping(path, static_cast<unsigned char*>(base), expected_size, held, st));
  if (base == nullptr) {
    m->guard_ = MappingGuard::kDetached;  // nothing mapped: nothing to guard
    return m;
  }
  {
    std::lock_guard<std::mutex> g(r.mu);
    r.live[reinterpret_cast<uintptr_t>(base)] = {m, m->size_};
    m->signal_slot_ = claim_signal_slot(path, m->data_, m->size_);
  }
  if (held < 0) return m;
  // A read lease, where the kernel grants one: EAGAIN while anyone has the file open for writing,
  // EACCES for another user's file without CAP_LEASE, EINVAL on filesystems without leases.
  const pid_t watcher = r.watcher();
  struct f_owner_ex owner {};
  owner.type = F_OWNER_TID;
  owner.pid = watcher;
  if (::fcntl(held, F_SETSIG, kLeaseSignal) == 0 && ::fcntl(held, F_SETLEASE, F_RDLCK) == 0) {
    ::fcntl(held, F_SETOWN_EX, &owner);
    {
      std::lock_guard<std::mutex> g(r.mu);
      r.leased.push_back(m.get());
      m->guard_ = MappingGuard::kLease;
    }
    // Wakes the watcher, which now scans while leases exist.
    ::syscall(SYS_tgkill, ::getpid(), watcher, kLeaseSignal);
  }
  return m;
}

FileMapping::FileMapping(std::string path, unsigned char* data, uint64_t size, int fd,
                         const struct stat& st)
    : path_(std::move(path)),
      data_(data),
      size_(size),
      fd_(fd),
      dev_(st.st_dev),
      ino_(st.st_ino),
      mtime_sec_(st.st_mtim.tv_sec),
      mtime_nsec_(st.st_mtim.tv_nsec) {
  ++g_mappings;
}

FileMapping::~FileMapping() {
  Registry& r = Registry::get();
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (data_ != nullptr) r.live.erase(reinterpret_cast<uintptr_t>(data_));
    r.leased.erase(std::remove(r.leased.begin(), r.leased.end(), this), r.leased.end());
    if (signal_slot_ >= 0) {
      g_signal_slots[signal_slot_].begin.store(0, std::memory_order_release);
      g_signal_slots[signal_slot_].end.store(0, std::memory_order_release);
    }
    if (fd_ >= 0) {
      // Ends the lease explicitly: a forked child may hold this open file too.
      if (guard_ == MappingGuard::kLease) ::fcntl(fd_, F_SETLEASE, F_UNLCK);
      ::close(fd_);
      fd_ = -1;
      --r.held_files;
    }
  }
  if (data_ != nullptr) ::munmap(data_, size_);
  --g_mappings;
}

void FileMapping::detach() {
  check();  // a file already changed cannot be copied as it was mapped
  Registry& r = Registry::get();
  std::lock_guard<std::mutex> g(r.mu);
  detach_locked();
}

namespace {

// Replaces [at, at + bytes) by private memory holding the same bytes, in one step (mremap):
// readers in other threads see the same bytes throughout. False where there is no memory.
bool copy_in_place(unsigned char* at, uint64_t bytes) {
  void* fresh = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (fresh == MAP_FAILED) return false;
  std::memcpy(fresh, at, bytes);
  if (::mremap(fresh, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, at) != MAP_FAILED) return true;
  ::munmap(fresh, bytes);
  return false;
}

}  // namespace

void FileMapping::detach_locked() {
  if (guard_ == MappingGuard::kDetached) return;
  Registry& r = Registry::get();
  // The bytes, read through the mapping (and its views) while the file is still whole (a writer
  // waiting on the lease cannot have changed it), move to private memory at the same addresses.
  // A write to a weight from another thread during the copy would be lost; weights are not
  // written while their file is being replaced.
  bool copied = true;
  for (MappedView* v : views_) copied = copied && v->detach_locked();
  copied = copied && copy_in_place(data_, size_);
  r.leased.erase(std::remove(r.leased.begin(), r.leased.end(), this), r.leased.end());
  if (!copied) {
    // No memory for a copy: the lease goes (a writer must not wait on us for nothing) and the
    // file is checked like any unleased one, so the change is reported at the next check.
    if (fd_ >= 0) ::fcntl(fd_, F_SETLEASE, F_UNLCK);
    guard_ = MappingGuard::kChecked;
    return;
  }
  // Detached before the lease goes, so that whoever waited on it finds it detached.
  guard_ = MappingGuard::kDetached;
  ++g_detached;
  if (fd_ >= 0) {
    // Released explicitly: a forked child may share this open file, and with it the lease.
    ::fcntl(fd_, F_SETLEASE, F_UNLCK);  // the writer proceeds
    ::close(fd_);
    fd_ = -1;
    --r.held_files;
  }
}

void FileMapping::check() const {
  if (guard_ == MappingGuard::kDetached) return;
  struct stat st {};
  int rc = 0, err = 0;
  {
    std::lock_guard<std::mutex> g(Registry::get().mu);  // fd_ may be closed by a detach
    if (guard_ == MappingGuard::kDetached) return;
    if (fd_ >= 0) {
      rc = ::fstat(fd_, &st);
    } else {
      // Not held open: the path tells only while it still names the mapped inode. Deleted or
      // replaced by rename, the mapped inode is out of reach, and was allowed to go.
      if (::stat(path_.c_str(), &st) != 0 || st.st_dev != dev_ || st.st_ino != ino_) return;
    }
    err = errno;
  }
  if (rc != 0) throw ReadError(path_ + ": cannot check the mapped file: " + errno_text(err));
  const char* rule =
      " while tensors loaded zero-copy map it; its weights can no longer be trusted: load the "
      "model again (replace checkpoint files by rename, never in place; README, Reliability)";
  if (static_cast<uint64_t>(st.st_size) != size_) {
    throw FileChangedError(path_ + ": the file was " +
                           (static_cast<uint64_t>(st.st_size) < size_ ? "truncated" : "extended") +
                           " to " + std::to_string(static_cast<uint64_t>(st.st_size)) + " bytes (" +
                           std::to_string(size_) + " when mapped)" + rule);
  }
  if (st.st_mtim.tv_sec != mtime_sec_ || st.st_mtim.tv_nsec != mtime_nsec_) {
    throw FileChangedError(path_ + ": the file was written in place (its modification time " +
                           "changed since it was mapped)" + rule);
  }
}

std::shared_ptr<FileMapping> FileMapping::containing(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  Registry& r = Registry::get();
  // Declared before the lock: if it holds the last reference, the destructor (which locks the
  // registry) runs after the lock is released.
  std::shared_ptr<FileMapping> m;
  bool inside = false;
  {
    std::lock_guard<std::mutex> g(r.mu);
    auto it = r.live.upper_bound(a);
    if (it != r.live.begin()) {
      --it;
      m = it->second.map.lock();
      inside = m && a < it->first + it->second.bytes;
    }
  }
  return inside ? m : nullptr;
}

// --- views ------------------------------------------------------------------------------------

namespace {

uint64_t page_bytes() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// Memory maps the views may take together: the process's limit (vm.max_map_count) less room for
// everything else (allocator arenas, thread stacks, libraries, the files' own mappings). Past it
// mmap fails everywhere in the process, not only here.
int64_t view_map_budget() {
  static const int64_t budget = [] {
    long long limit = 65530;  // Linux's default
    if (FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
      long long v = 0;
      if (std::fscanf(f, "%lld", &v) == 1 && v > 0) limit = v;
      std::fclose(f);
    }
    return std::max<int64_t>(0, static_cast<int64_t>(limit) - 16384);
  }();
  return budget;
}
std::atomic<int64_t> g_view_maps{0};

// Sorts `pieces` by offset and merges those that follow each other in the file too (one mmap);
// returns why they do not cover [0, size) exactly within a file of `file_size` bytes, or "".
std::string tile_pieces(uint64_t size, uint64_t file_size, std::vector<ViewPiece>& pieces) {
  std::sort(pieces.begin(), pieces.end(),
            [](const ViewPiece& a, const ViewPiece& b) { return a.offset < b.offset; });
  std::vector<ViewPiece> merged;
  uint64_t at = 0;
  for (const ViewPiece& p : pieces) {
    if (p.offset != at) {
      return "view byte " + std::to_string(at) +
             (p.offset < at ? " is covered twice" : " is not covered");
    }
    if (p.file_offset > file_size || p.length > file_size - p.file_offset) {
      return "file bytes [" + std::to_string(p.file_offset) + ", " +
             std::to_string(p.file_offset + p.length) + ") are past its end (" +
             std::to_string(file_size) + " bytes)";
    }
    at += p.length;
    if (p.length == 0) continue;
    if (!merged.empty() && merged.back().file_offset + merged.back().length == p.file_offset) {
      merged.back().length += p.length;
    } else {
      merged.push_back(p);
    }
  }
  if (at != size)
    return "the pieces cover " + std::to_string(at) + " of its " + std::to_string(size) + " bytes";
  pieces = std::move(merged);
  return "";
}

// Reads file bytes [offset, offset + n) into `dst`; a ReadError naming the file where it cannot.
void read_exactly(int fd, unsigned char* dst, uint64_t n, uint64_t offset,
                  const std::string& path) {
  for (uint64_t done = 0; done < n;) {
    const ssize_t got = ::pread(fd, dst + done, n - done, static_cast<off_t>(offset + done));
    if (got > 0) {
      done += static_cast<uint64_t>(got);
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else {
      throw ReadError(
          path + ": reading bytes [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
          ") failed: " + (got == 0 ? std::string("the file ended") : errno_text(errno)));
    }
  }
}

}  // namespace

bool MappedView::detach_locked() {
  if (detached_) return true;
  detached_ = copy_in_place(region_, region_bytes_);
  return detached_;
}

MappedView::~MappedView() {
  if (map_) {
    FileMapping::Registry& r = FileMapping::Registry::get();
    std::lock_guard<std::mutex> g(r.mu);
    r.live.erase(reinterpret_cast<uintptr_t>(region_));
    auto& views = map_->views_;
    views.erase(std::remove(views.begin(), views.end(), this), views.end());
    for (int i : signal_slots_) release_segment_slot(i);
  }
  if (region_ != nullptr) ::munmap(region_, region_bytes_);
  g_view_maps -= maps_;
}

// Maps each piece's whole pages from the file (through `fd`) at its place in the view's region,
// and reads the partial pages at its ends; false where an mmap fails.
bool FileMapping::fill_view(MappedView& v, const std::vector<ViewPiece>& pieces, int fd) const {
  const uint64_t page = page_bytes();
  const uint64_t lead = static_cast<uint64_t>(v.data_ - v.region_);
  for (const ViewPiece& p : pieces) {
    const uint64_t begin = lead + p.offset, end = begin + p.length;
    const uint64_t a = (begin + page - 1) / page * page, b = end / page * page;
    if (a >= b) {
      read_exactly(fd, v.region_ + begin, p.length, p.file_offset, path_);
      continue;
    }
    // file_offset - begin is a multiple of the page (map_view checked), so is this offset.
    const uint64_t file_a = p.file_offset + (a - begin);
    if (::mmap(v.region_ + a, b - a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd,
               static_cast<off_t>(file_a)) == MAP_FAILED) {
      return false;
    }
    v.runs_.push_back({a, file_a, b - a});
    read_exactly(fd, v.region_ + begin, a - begin, p.file_offset, path_);
    read_exactly(fd, v.region_ + b, end - b, p.file_offset + (b - begin), path_);
  }
  return true;
}

std::shared_ptr<MappedView> FileMapping::map_view(uint64_t size, std::vector<ViewPiece> pieces) {
  const std::string bad = tile_pieces(size, size_, pieces);
  if (!bad.empty())
    throw PlanError(path_ + ": cannot assemble a view of " + std::to_string(size) +
                    " bytes: " + bad);
  const uint64_t page = page_bytes();
  if (size == 0) return nullptr;
  // Where byte 0 lies in the region's first page: there every piece's file pages line up with
  // the region's, if all pieces agree.
  auto residue = [page](const ViewPiece& p) {
    return (p.file_offset % page + page - p.offset % page) % page;
  };
  const uint64_t lead = residue(pieces[0]);
  for (const ViewPiece& p : pieces)
    if (residue(p) != lead) return nullptr;
  Registry& r = Registry::get();
  UniqueFd fd;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (guard_ != MappingGuard::kDetached && fd_ >= 0) fd.reset(::fcntl(fd_, F_DUPFD_CLOEXEC, 0));
  }
  if (!fd) return nullptr;
  std::shared_ptr<MappedView> v(new MappedView());
  const int64_t maps = 2 * static_cast<int64_t>(pieces.size()) + 1;
  if (g_view_maps.fetch_add(maps) + maps > view_map_budget()) {
    g_view_maps -= maps;
    return nullptr;
  }
  v->maps_ = maps;
  v->region_bytes_ = (lead + size + page - 1) / page * page;
  // Reserved whole (private, never charged as a whole: most of it becomes the file's pages).
  void* region = ::mmap(nullptr, v->region_bytes_, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) return nullptr;
  v->region_ = static_cast<unsigned char*>(region);
  v->data_ = v->region_ + lead;
  v->size_ = size;
  if (!fill_view(*v, pieces, fd.get())) return nullptr;
  std::lock_guard<std::mutex> g(r.mu);
  // Detached meanwhile (a lease broke): a writer may have changed the file since it was mapped
  // here. Copy instead, from the detached bytes. (The view dies after the lock is released.)
  if (guard_ == MappingGuard::kDetached) return std::shared_ptr<MappedView>(nullptr);
  return register_view(std::move(v));
}

std::shared_ptr<MappedView> FileMapping::register_view(std::shared_ptr<MappedView> v) {
  Registry& r = Registry::get();
  v->map_ = shared_from_this();
  views_.push_back(v.get());
  r.live[reinterpret_cast<uintptr_t>(v->region_)] = {v->map_, v->region_bytes_};
  const uintptr_t region = reinterpret_cast<uintptr_t>(v->region_);
  for (const ViewPiece& run : v->runs_) {
    const int slot = claim_segment_slot(region + run.offset, region + run.offset + run.length,
                                        run.file_offset, signal_slot_);
    if (slot >= 0) v->signal_slots_.push_back(slot);
  }
  return v;
}

int64_t FileMapping::live_count() {
  return g_mappings.load();
}

int64_t FileMapping::detached_count() {
  return g_detached.load();
}

void FileMapping::populate(uint64_t offset, uint64_t length, unsigned char* at) const {
  if (length == 0) return;
  const uint64_t page = page_bytes();
  const uint64_t start = offset / page * page;
  const uint64_t end = std::min(size_, offset + length);
  // Where file byte `start` lies: here, or in a view (whose pages line up with the file's).
  unsigned char* first = at == nullptr ? data_ + start : at - (offset - start);
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
  if (::madvise(first, end - start, MADV_POPULATE_READ) == 0) return;
  if (errno != EINVAL) {
    throw ReadError(path_ + ": reading bytes [" + std::to_string(offset) + ", " +
                    std::to_string(end) + ") failed: " + errno_text(errno));
  }
  // A kernel without MADV_POPULATE_READ: fault the pages by reading them (a read error is then a
  // SIGBUS, as with any mapped file).
  volatile unsigned char sink = 0;
  for (uint64_t p = 0; p < end - start; p += page) sink ^= first[p];
  (void)sink;
}

namespace {

#ifndef __NR_cachestat
#define __NR_cachestat 451  // the same number on every architecture (Linux 6.5)
#endif

struct CachestatRange {
  uint64_t off, len;
};
struct Cachestat {
  uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

std::atomic<bool> g_no_cachestat{false};  // ENOSYS / EPERM once: not asked again

}  // namespace

int FileMapping::dup_fd() const {
  if (g_no_cachestat.load(std::memory_order_relaxed)) return -1;
  std::lock_guard<std::mutex> g(Registry::get().mu);  // fd_ may be closed by a detach
  return fd_ >= 0 ? ::fcntl(fd_, F_DUPFD_CLOEXEC, 0) : -1;
}

namespace {

// Pages of [start, start + length) the page cache holds (cachestat on `fd`); -1 where the kernel
// cannot say.
int64_t cachestat_pages(int fd, uint64_t start, uint64_t length) {
  CachestatRange range{start, length};
  Cachestat stat{};
  if (::syscall(__NR_cachestat, fd, &range, &stat, 0) == 0)
    return static_cast<int64_t>(stat.nr_cache);
  if (errno == ENOSYS || errno == EPERM) g_no_cachestat = true;
  return -1;
}

}  // namespace

bool FileMapping::all_cached(uint64_t start, uint64_t end, uint64_t n_pages) const {
  const UniqueFd fd(dup_fd());
  if (!fd) return false;
  const int64_t cached = cachestat_pages(fd.get(), start, end - start);
  return cached >= 0 && static_cast<uint64_t>(cached) >= n_pages;
}

int64_t FileMapping::cached_pages(const std::vector<std::pair<uint64_t, uint64_t>>& windows) const {
  const UniqueFd fd(dup_fd());
  if (!fd) return -1;
  int64_t sum = 0;
  for (const auto& [offset, length] : windows) {
    const int64_t n = length == 0 ? 0 : cachestat_pages(fd.get(), offset, length);
    if (n < 0) {
      sum = -1;
      break;
    }
    sum += n;
  }
  return sum;
}

std::vector<std::pair<uint64_t, uint64_t>> FileMapping::uncached_runs(uint64_t offset,
                                                                      uint64_t length) const {
  const uint64_t page = page_bytes();
  const uint64_t start = offset / page * page;
  const uint64_t end = std::min(size_, offset + length);
  if (end <= start) return {};
  const uint64_t n_pages = (end - start + page - 1) / page;
  // The page cache's own count first (cachestat): a range it holds whole needs nothing, found
  // without mincore's lookup of every page (5x the time on a warm 2.5 GB file).
  if (all_cached(start, end, n_pages)) return {};
  std::vector<unsigned char> resident(n_pages);
  if (::mincore(data_ + start, end - start, resident.data()) != 0) return {{start, end - start}};
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  for (uint64_t i = 0; i < n_pages;) {
    if (resident[i] & 1) {
      ++i;
      continue;
    }
    uint64_t j = i;
    while (j < n_pages && !(resident[j] & 1)) ++j;
    const uint64_t a = start + i * page, b = std::min(end, start + j * page);
    runs.emplace_back(a, b - a);
    i = j;
  }
  return runs;
}

uint64_t FileMapping::prefetch_uncached(uint64_t offset, uint64_t length) const {
  uint64_t asked = 0;
  for (const auto& [a, n] : uncached_runs(offset, length)) {
    ::madvise(data_ + a, n, MADV_WILLNEED);  // readahead; a failure only means no head start
    asked += n;
  }
  return asked;
}

uint64_t FileMapping::populate_uncached(uint64_t offset, uint64_t length, unsigned char* at) const {
  const auto runs = uncached_runs(offset, length);
  // Every run's reads in flight at once (readahead into the page cache: the file's own mapping
  // serves for a view's too), then each waited for and mapped.
  if (runs.size() > 1)
    for (const auto& [a, n] : runs) ::madvise(data_ + a, n, MADV_WILLNEED);
  uint64_t faulted = 0;
  for (const auto& [a, n] : runs) {
    // A run starts at most a page before `offset`, where a view's region still lies.
    populate(
        a, n,
        at == nullptr ? nullptr : at + (static_cast<int64_t>(a) - static_cast<int64_t>(offset)));
    faulted += n;
  }
  return faulted;
}

}  // namespace metaload
