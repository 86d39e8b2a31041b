// Views (FileMapping::map_view): pieces of a checkpoint file side by side at fresh addresses,
// their whole pages the file's own (copy-on-write), the pages where pieces meet read. The fused
// experts of a zero-copy MoE load are such views; they keep the mapping's contract
// (loader/engine/file_mapping.h): detached with it, found by containing(), named on SIGBUS.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "loader/engine/file_mapping.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;
using testing::TempDir;
using testing::write_file;

const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
constexpr uint64_t kSize = 1 << 20;
constexpr uint64_t kBase = 1000;  // where the first tensor starts: not on a page boundary

// kSize bytes: byte i is i * 13 + i / 4093 + salt (no two pages alike).
std::string pattern(int salt) {
  std::string s(kSize, '\0');
  for (uint64_t i = 0; i < kSize; ++i) s[i] = static_cast<char>(i * 13 + i / 4093 + salt);
  return s;
}

// The fused gate_up of two experts (w1 then w3 of each), from a file storing w1, w2, w3 of each
// expert in turn from kBase, every tensor `tensor` bytes: the pieces and the bytes they make.
struct Fused {
  std::vector<ViewPiece> pieces;
  std::string bytes;
};
Fused gate_up(const std::string& file, uint64_t tensor) {
  Fused f;
  for (uint64_t e = 0; e < 2; ++e) {
    for (uint64_t k : {0, 2}) {
      const ViewPiece p{f.bytes.size(), kBase + (3 * e + k) * tensor, tensor};
      f.pieces.push_back(p);
      f.bytes += file.substr(p.file_offset, p.length);
    }
  }
  return f;
}

std::string bytes_of(const MappedView& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

// Memory maps of this process overlapping [begin, end) (/proc/self/maps), and how many of them
// map the file `path`.
struct Maps {
  int all = 0, file = 0;
};
Maps maps_over(const void* begin, uint64_t bytes, const std::string& path) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(begin), hi = lo + bytes;
  std::ifstream in("/proc/self/maps");
  Maps out;
  for (std::string line; std::getline(in, line);) {
    uintptr_t a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &a, &b) != 2 || b <= lo || a >= hi) continue;
    ++out.all;
    if (line.size() >= path.size() &&
        line.compare(line.size() - path.size(), path.size(), path) == 0)
      ++out.file;
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class MappedViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_ / "model.safetensors";
    write_file(path_, file_);
    map_ = FileMapping::open(path_, kSize);
  }
  TempDir dir_;
  std::string path_;
  const std::string file_ = pattern(1);
  std::shared_ptr<FileMapping> map_;
};

TEST_F(MappedViewTest, EachPieceLiesWhereAskedAndItsWholePagesAreTheFiles) {
  const Fused f = gate_up(file_, 3 * kPage);
  auto v = map_->map_view(f.bytes.size(), f.pieces);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->mapping(), map_);
  EXPECT_EQ(v->size(), f.bytes.size());
  // Byte 0 sits at the file's residue, so each piece's pages line up with the file's.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data()) % kPage, kBase % kPage);
  EXPECT_EQ(bytes_of(*v), f.bytes);  // the pages where pieces meet too
  // The pages wholly inside a piece are the file's; the pages where pieces meet, and the
  // region's first and last, are private. Expert 0's w3 and expert 1's w1 follow each other in
  // the file as in the view: one map. So 3 file maps, and 4 private ones between and around.
  const Maps m = maps_over(v->data(), v->size(), path_);
  EXPECT_EQ(m.file, 3);
  EXPECT_EQ(m.all, 7);
}

TEST_F(MappedViewTest, PiecesThatFollowEachOtherInTheFileAreOneMap) {
  // down_proj's layout: each expert's whole tensor in file order (here: two of three in a row).
  const uint64_t t = 5 * kPage;
  const std::vector<ViewPiece> pieces = {
      {0, kBase, t}, {t, kBase + t, t}, {2 * t, kBase + 4 * t, t}};
  auto v = map_->map_view(3 * t, pieces);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(bytes_of(*v), file_.substr(kBase, 2 * t) + file_.substr(kBase + 4 * t, t));
  EXPECT_EQ(maps_over(v->data(), v->size(), path_).file, 2);
}

TEST_F(MappedViewTest, PiecesSmallerThanAPageAreReadWhole) {
  const std::vector<ViewPiece> pieces = {{0, kBase + 3 * kPage, 100}, {100, kBase + 100, 50}};
  auto v = map_->map_view(150, pieces);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(bytes_of(*v), file_.substr(kBase + 3 * kPage, 100) + file_.substr(kBase + 100, 50));
  EXPECT_EQ(maps_over(v->data(), v->size(), path_).file, 0);
}

TEST_F(MappedViewTest, PiecesOfDifferentResiduesAreNoView) {
  // An odd-sized tensor in between moved the second piece off the first's residue.
  const std::vector<ViewPiece> pieces = {{0, kBase, kPage}, {kPage, kBase + 3 * kPage + 2, kPage}};
  EXPECT_EQ(map_->map_view(2 * kPage, pieces), nullptr);
}

TEST_F(MappedViewTest, PiecesThatDoNotCoverTheViewAreAPlanErrorNamingTheFile) {
  const auto gap = expect_error<PlanError>([&] {
    map_->map_view(3 * kPage, {{0, kBase, kPage}, {2 * kPage, kBase, kPage}});
  });
  EXPECT_NE(std::string(gap.what())
                .find(path_ + ": cannot assemble a view of 12288 bytes: view "
                              "byte 4096 is not covered"),
            std::string::npos)
      << gap.what();
  expect_error<PlanError>([&] { map_->map_view(kPage, {{0, kBase, kPage}, {0, kBase, kPage}}); });
  expect_error<PlanError>([&] { map_->map_view(kPage, {{0, kSize - 10, kPage}}); });
}

TEST_F(MappedViewTest, ContainingFindsTheMappingAndTheRegionGoesWithTheLastOwner) {
  const Fused f = gate_up(file_, 3 * kPage);
  auto v = map_->map_view(f.bytes.size(), f.pieces);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(FileMapping::containing(v->data()), map_);
  EXPECT_EQ(FileMapping::containing(v->data() + v->size() - 1), map_);
  EXPECT_EQ(FileMapping::containing(v->data() + 5 * kPage), map_);
  // The view keeps the mapping alive after everyone else lets go.
  std::weak_ptr<FileMapping> weak = map_;
  map_.reset();
  EXPECT_FALSE(weak.expired());
  unsigned char* data = v->data();
  const uint64_t size = v->size();
  v.reset();
  EXPECT_TRUE(weak.expired());
  EXPECT_EQ(FileMapping::containing(data), nullptr);
  // Nothing is mapped there any more.
  EXPECT_EQ(maps_over(data, size, path_).all, 0);
  unsigned char resident = 0;
  const uintptr_t page = reinterpret_cast<uintptr_t>(data) / kPage * kPage;
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(page), kPage, &resident), -1);
  EXPECT_EQ(errno, ENOMEM);
}

TEST_F(MappedViewTest, WritesStayInTheProcess) {
  const Fused f = gate_up(file_, 3 * kPage);
  auto v = map_->map_view(f.bytes.size(), f.pieces);
  ASSERT_NE(v, nullptr);
  const uint64_t file_page = 3 * kPage + kPage + 5;  // inside the second piece's file pages
  const uint64_t seam = 3 * kPage - 1;               // the first piece's last byte, a read page
  v->data()[file_page] ^= 0xff;
  v->data()[seam] ^= 0xff;
  EXPECT_EQ(read_file(path_), file_);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(map_->data()), kSize), file_);
  std::string want = f.bytes;
  want[file_page] ^= static_cast<char>(0xff);
  want[seam] ^= static_cast<char>(0xff);
  EXPECT_EQ(bytes_of(*v), want);
}

TEST_F(MappedViewTest, PopulateFaultsInTheViewsPages) {
  const Fused f = gate_up(file_, 3 * kPage);
  auto v = map_->map_view(f.bytes.size(), f.pieces);
  ASSERT_NE(v, nullptr);
  for (const ViewPiece& p : f.pieces) {
    map_->populate(p.file_offset, p.length, v->data() + p.offset);
    map_->populate_uncached(p.file_offset, p.length, v->data() + p.offset);
  }
  std::vector<unsigned char> resident((v->size() + 2 * kPage) / kPage);
  const uintptr_t first = reinterpret_cast<uintptr_t>(v->data()) / kPage * kPage;
  ASSERT_EQ(::mincore(reinterpret_cast<void*>(first), resident.size() * kPage, resident.data()), 0);
  for (unsigned char r : resident) EXPECT_TRUE(r & 1);
  EXPECT_EQ(bytes_of(*v), f.bytes);
}

TEST_F(MappedViewTest, ADetachedMappingKeepsItsViewsBytesAndGivesNoNewViews) {
  const Fused f = gate_up(file_, 3 * kPage);
  auto v = map_->map_view(f.bytes.size(), f.pieces);
  ASSERT_NE(v, nullptr);
  unsigned char* data = v->data();
  map_->detach();
  EXPECT_EQ(map_->guard(), MappingGuard::kDetached);
  EXPECT_EQ(v->data(), data);
  EXPECT_EQ(maps_over(data, v->size(), path_).file, 0);  // private memory now
  // The file rewritten, then cut short: the view keeps what it held.
  write_file(path_, pattern(2));
  ASSERT_EQ(::truncate(path_.c_str(), 10), 0);
  EXPECT_EQ(bytes_of(*v), f.bytes);
  EXPECT_EQ(FileMapping::containing(data), map_);
  EXPECT_EQ(map_->map_view(f.bytes.size(), f.pieces), nullptr);  // copy instead
}

TEST_F(MappedViewTest, ABrokenLeaseDetachesTheViewsFirst) {
  if (map_->guard() != MappingGuard::kLease)
    GTEST_SKIP() << "no read lease on " << dir_.path() << " (filesystem or permissions)";
  const Fused f = gate_up(file_, 3 * kPage);
  auto v = map_->map_view(f.bytes.size(), f.pieces);
  ASSERT_NE(v, nullptr);
  ASSERT_EQ(::truncate(path_.c_str(), 0), 0);  // waits until the bytes are copied
  EXPECT_EQ(map_->guard(), MappingGuard::kDetached);
  EXPECT_EQ(bytes_of(*v), f.bytes);  // every page readable: no SIGBUS
}

TEST_F(MappedViewTest, ASigbusInAViewNamesTheFileAndTheFilesByte) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // this process runs a watcher thread
  const Fused f = gate_up(file_, 3 * kPage);
  EXPECT_EXIT(
      {
        // No lease (a writer has it open), so a truncation lands under the view.
        const int writer = ::open(path_.c_str(), O_WRONLY);
        auto m = FileMapping::open(path_, kSize);
        auto v = m->map_view(f.bytes.size(), f.pieces);
        if (writer < 0 || v == nullptr || m->guard() != MappingGuard::kChecked ||
            ::ftruncate(writer, 0) != 0)
          std::_Exit(3);
        // View byte 3 pages + 1 page + 7: the second piece's (w3 of expert 0) file page.
        volatile unsigned char b = v->data()[4 * kPage + 7];
        (void)b;
        std::_Exit(4);  // not reached
      },
      ::testing::KilledBySignal(SIGBUS),
      "metaload: SIGBUS reading .*/model\\.safetensors at byte " +
          std::to_string(kBase + 6 * kPage + kPage + 7) + ", mapped zero-copy");
}

}  // namespace
}  // namespace metaload
