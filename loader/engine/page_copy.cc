#include "loader/engine/page_copy.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/unique_fd.h"

namespace metaload {

namespace {

constexpr uint64_t kPage = 4096;

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

// A userfaultfd for this process: the syscall (no privilege needed with UFFD_USER_MODE_ONLY,
// Linux 5.11), else /dev/userfaultfd (Linux 6.1, where the device's permissions allow). -1 if
// neither.
UniqueFd open_userfaultfd() {
#ifdef SYS_userfaultfd
  UniqueFd fd(static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY)));
  if (fd) return fd;
#endif
#ifdef USERFAULTFD_IOC_NEW
  const UniqueFd dev(::open("/dev/userfaultfd", O_RDWR | O_CLOEXEC));
  if (dev) {
    UniqueFd made(::ioctl(dev.get(), USERFAULTFD_IOC_NEW, O_CLOEXEC | UFFD_USER_MODE_ONLY));
    if (made) return made;
  }
#endif
  return UniqueFd();
}

// The API handshake, with stores to a missing page raising SIGBUS instead of waiting for a
// handler this process does not run (a bug then crashes, it never hangs), and [base, base +
// bytes) registered for missing pages.
bool handshake_and_register(int fd, void* base, uint64_t bytes) {
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = UFFD_FEATURE_SIGBUS;
  if (::ioctl(fd, UFFDIO_API, &api) != 0) return false;
  uffdio_register reg{};
  reg.range.start = reinterpret_cast<uintptr_t>(base);
  reg.range.len = bytes;
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  return ::ioctl(fd, UFFDIO_REGISTER, &reg) == 0 && (reg.ioctls & (1ull << _UFFDIO_COPY)) != 0;
}

void unregister(int fd, void* base, uint64_t bytes) {
  uffdio_range range{};
  range.start = reinterpret_cast<uintptr_t>(base);
  range.len = bytes;
  ::ioctl(fd, UFFDIO_UNREGISTER, &range);
}

// Whether this kernel copies from a source that is not page-aligned (older ones want it
// aligned): one page of a scratch mapping of our own, copied from an odd address.
bool copies_unaligned_sources() {
  void* scratch =
      ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (scratch == MAP_FAILED) return false;
  bool ok = false;
  const UniqueFd fd = open_userfaultfd();
  if (fd && handshake_and_register(fd.get(), scratch, kPage)) {
    static unsigned char source[2 * kPage];
    source[1] = 42;
    uffdio_copy c{};
    c.dst = reinterpret_cast<uintptr_t>(scratch);
    c.src = reinterpret_cast<uintptr_t>(source + 1);
    c.len = kPage;
    ok = ::ioctl(fd.get(), UFFDIO_COPY, &c) == 0 && static_cast<unsigned char*>(scratch)[0] == 42;
    unregister(fd.get(), scratch, kPage);
  }
  ::munmap(scratch, kPage);
  return ok;
}

}  // namespace

struct PageCopier::Counter {
  std::atomic<uint64_t> pages{0};
};

namespace {
std::atomic<uint64_t> g_pages_copied{0};
}  // namespace

uint64_t PageCopier::pages_copied_total() {
  return g_pages_copied.load();
}

std::unique_ptr<PageCopier> PageCopier::open(void* base, uint64_t bytes) {
  if (base == nullptr || bytes == 0 || reinterpret_cast<uintptr_t>(base) % kPage != 0) {
    return nullptr;
  }
  static const bool unaligned_ok = copies_unaligned_sources();
  if (!unaligned_ok) return nullptr;
  UniqueFd fd = open_userfaultfd();
  const uint64_t len = (bytes + kPage - 1) / kPage * kPage;
  if (!fd || !handshake_and_register(fd.get(), base, len)) return nullptr;
  return std::unique_ptr<PageCopier>(new PageCopier(std::move(fd), base, len));
}

PageCopier::PageCopier(UniqueFd fd, void* base, uint64_t bytes)
    : fd_(std::move(fd)), base_(base), bytes_(bytes), copied_(new Counter) {}

PageCopier::~PageCopier() {
  unregister(fd_.get(), base_, bytes_);  // then fd_ closes
}

uint64_t PageCopier::pages_copied() const {
  return copied_->pages.load();
}

int64_t PageCopier::copy_pages(unsigned char* dst, const unsigned char* src, uint64_t n) {
  uint64_t done = 0;
  int stalls = 0;
  while (done < n) {
    uffdio_copy c{};
    c.dst = reinterpret_cast<uintptr_t>(dst + done);
    c.src = reinterpret_cast<uintptr_t>(src + done);
    c.len = n - done;
    const int r = ::ioctl(fd_.get(), UFFDIO_COPY, &c);
    const int64_t got = c.copy > 0 ? c.copy : 0;
    done += static_cast<uint64_t>(got);
    copied_->pages += static_cast<uint64_t>(got) / kPage;
    g_pages_copied += static_cast<uint64_t>(got) / kPage;
    if (r == 0) continue;
    if (errno == EEXIST || c.copy == -EEXIST) return static_cast<int64_t>(done);
    // EAGAIN: the copy stopped early (a source page had to be faulted in, or the address space
    // changed); go on from where it stopped, unless it keeps making no progress (the source is
    // gone: a file shrunk under its mapping).
    if ((errno == EAGAIN || errno == EINTR) && (got > 0 || ++stalls < 64)) continue;
    return -1;
  }
  return static_cast<int64_t>(done);
}

namespace {
// n bytes of the source at `offset` into dst: from memory, or from the file with pread (a file
// that shrank is a short read, never a SIGBUS).
bool read_exact(const PageCopier::Source& src, unsigned char* dst, uint64_t offset, uint64_t n) {
  if (src.fd < 0) {
    std::memcpy(dst, src.map + offset, n);
    return true;
  }
  const int fd = src.fd;
  while (n > 0) {
    const ssize_t r = ::pread(fd, dst, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    dst += r, offset += static_cast<uint64_t>(r), n -= static_cast<uint64_t>(r);
  }
  return true;
}
}  // namespace

// Bytes [dst, dst + n) within one page: through a zeroed bounce page holding only them, or over
// the page another fill placed first.
bool PageCopier::fill_partial_page(unsigned char* page, unsigned char* dst, const Source& src,
                                   uint64_t n) {
  alignas(64) unsigned char bounce[kPage];
  std::memset(bounce, 0, kPage);
  if (!read_exact(src, bounce + (dst - page), src.offset, n)) return false;
  const int64_t got = copy_pages(page, bounce, kPage);
  if (got < 0) return false;
  // Present already (another fill placed it): a write is fine now.
  return got > 0 || read_exact(src, dst, src.offset, n);
}

bool PageCopier::fill(unsigned char* dst, Source src, uint64_t n) {
  while (n > 0) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(dst);
    unsigned char* page = reinterpret_cast<unsigned char*>(at & ~(kPage - 1));
    const uint64_t in_page =
        std::min<uint64_t>(n, kPage - (at - reinterpret_cast<uintptr_t>(page)));
    uint64_t step = in_page;
    if (dst != page || in_page < kPage) {  // a page this range shares (or may share)
      if (!fill_partial_page(page, dst, src, in_page)) return false;
    } else {
      const uint64_t whole = n / kPage * kPage;
      const int64_t got = copy_pages(dst, src.map + src.offset, whole);
      if (got < 0) return false;
      step = static_cast<uint64_t>(got);
      if (step < whole) {  // a present page inside: written in place
        if (!read_exact(src, dst + step, src.offset + step, kPage)) return false;
        step += kPage;
      }
    }
    dst += step, src.offset += step, n -= step;
  }
  return true;
}

}  // namespace metaload
