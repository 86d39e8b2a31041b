// The streaming safetensors writer and the sharded writer.
#include "loader/format/writer.h"

#include <sys/stat.h>

#include <cstring>
#include <numeric>

#include <gtest/gtest.h>

#include "loader/format/checkpoint.h"
#include "loader/format/json_util.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;
using testing::TempDir;

std::vector<char> iota_bytes(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 31 + seed) & 0xFF);
  return v;
}

// The one JSON string escaper: as nlohmann's dump() for headers, as Python's json.dumps
// (ensure_ascii) for model keys.
TEST(JsonString, PlainMatchesNlohmannAndAsciiMatchesPython) {
  const std::string samples[] = {
      "",        "w",           "a\"b\\c",      "\b\f\n\r\t",      "\x01\x1f",
      "del\x7f", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
  for (const std::string& s : samples)
    EXPECT_EQ(json_string(s), nlohmann::json(s).dump()) << ::testing::PrintToString(s);
  // Outputs of Python's json.dumps(s) (ensure_ascii=True, its default).
  EXPECT_EQ(json_string("a\"b\\c", true), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(json_string("\x01"
                        "del\x7f",
                        true),
            "\"\\u0001del\\u007f\"");
  EXPECT_EQ(json_string("caf\xc3\xa9 \xe2\x82\xac", true), "\"caf\\u00e9 \\u20ac\"");
  EXPECT_EQ(json_string("\xf0\x9f\x98\x80", true), "\"\\ud83d\\ude00\"");
  std::string out = "x";
  append_json_string(out, "\n", true);
  EXPECT_EQ(out, "x\"\\n\"");
}

// Reads a tensor's bytes straight from the file (an independent check of the offsets).
std::string tensor_bytes(const SafetensorsHeader& h, const TensorInfo& t) {
  std::string all = testing::read_file(h.path);
  return all.substr(h.data_start + t.begin, t.nbytes());
}

// Within one element size, the safetensors library's dtype order wins over names, so that files
// are byte-identical to its save_file's (tests/python/test_safetensors_api.py compares the bytes).
TEST(Writer, SameSizeDtypesInTheSafetensorsLibrarysOrder) {
  std::vector<TensorSpec> specs = {
      {"a", DType::I32, {1}},     {"b", DType::F32, {1}},  {"c", DType::U32, {1}},
      {"d", DType::F16, {1}},     {"e", DType::BF16, {1}}, {"f", DType::I16, {1}},
      {"g", DType::U16, {1}},     {"h", DType::BOOL, {1}}, {"i", DType::U8, {1}},
      {"j", DType::I8, {1}},      {"k", DType::F64, {1}},  {"l", DType::I64, {1}},
      {"m", DType::U64, {1}},     {"n", DType::C64, {1}},  {"o", DType::F8_E5M2, {1}},
      {"p", DType::F8_E4M3, {1}}, {"q", DType::I32, {1}}};
  sort_for_writing(specs);
  std::string order;
  for (const TensorSpec& s : specs) order += s.name;
  EXPECT_EQ(order, "mlknbcaqedgfpojih");  // U64 I64 F64 C64 F32 U32 I32 I32 BF16 F16 U16 I16 ...
}

TEST(Writer, WritesAlignedHeaderAndRecommendedOrder) {
  TempDir dir;
  auto a = iota_bytes(2 * 3 * 2, 1);  // F16
  auto b = iota_bytes(5, 2);          // U8
  auto c = iota_bytes(4 * 8, 3);      // F64
  auto d = iota_bytes(7 * 4, 4);      // F32
  SafetensorsWriter w(dir / "m.safetensors", {{"format", "pt"}});
  w.add_bytes("layer.a", DType::F16, {2, 3}, a.data());
  w.add_bytes("b", DType::U8, {5}, b.data());
  w.add_bytes("c", DType::F64, {4}, c.data());
  w.add_bytes("a.d", DType::F32, {7}, d.data());
  SafetensorsHeader written = w.write();

  SafetensorsHeader h = read_safetensors_header(dir / "m.safetensors");
  EXPECT_EQ(h.data_start % 8, 0u);
  EXPECT_EQ(h.data_start, written.data_start);
  ASSERT_EQ(h.tensors.size(), 4u);
  // Largest element size first, then by name: every tensor is aligned to its element size.
  EXPECT_EQ(h.tensors[0].name, "c");
  EXPECT_EQ(h.tensors[1].name, "a.d");
  EXPECT_EQ(h.tensors[2].name, "layer.a");
  EXPECT_EQ(h.tensors[3].name, "b");
  for (const auto& t : h.tensors)
    EXPECT_EQ((h.data_start + t.begin) % (dtype_bits(t.dtype) / 8), 0u) << t.name;
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(tensor_bytes(h, *h.find("layer.a")), std::string(a.begin(), a.end()));
  EXPECT_EQ(tensor_bytes(h, *h.find("b")), std::string(b.begin(), b.end()));
  EXPECT_EQ(tensor_bytes(h, *h.find("c")), std::string(c.begin(), c.end()));
  EXPECT_EQ(tensor_bytes(h, *h.find("a.d")), std::string(d.begin(), d.end()));
  // The header begins with the metadata, as the reference writer puts it.
  std::string raw = testing::read_file(h.path);
  EXPECT_EQ(raw.substr(8, 16), "{\"__metadata__\":");
  // No temporary file is left behind.
  struct stat st;
  EXPECT_NE(::stat((dir / "m.safetensors.tmp-" + std::to_string(::getpid())).c_str(), &st), 0);
}

TEST(Writer, SmallBlocksCoalesceAcrossTensorsAndStillRoundTrip) {
  TempDir dir;
  std::vector<std::vector<char>> data;
  SafetensorsWriter w(dir / "m.safetensors");
  w.set_block_size(7);  // forces blocks that straddle tensor boundaries
  for (int i = 0; i < 20; ++i) data.push_back(iota_bytes(static_cast<size_t>(i) * 3 + 1, i));
  for (int i = 0; i < 20; ++i) {
    w.add_bytes("t" + std::to_string(i), DType::U8, {static_cast<int64_t>(data[i].size())},
                data[i].data());
  }
  w.write();
  SafetensorsHeader h = read_safetensors_header(dir / "m.safetensors");
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(tensor_bytes(h, *h.find("t" + std::to_string(i))),
              std::string(data[i].begin(), data[i].end()));
  }
}

TEST(Writer, SourcelessTensorsAreSparseZeros) {
  TempDir dir;
  auto small = iota_bytes(16, 9);
  SafetensorsWriter w(dir / "sparse.safetensors");
  w.add("huge", DType::BF16, {8192, 8192}, nullptr);  // 128 MiB of zeros
  w.add_bytes("tail", DType::U8, {16}, small.data());
  w.write();
  struct stat st;
  ASSERT_EQ(::stat((dir / "sparse.safetensors").c_str(), &st), 0);
  SafetensorsHeader h = read_safetensors_header(dir / "sparse.safetensors");
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), h.data_start + (128ull << 20) + 16);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512,
            1ull << 20);  // nothing allocated for the hole
  EXPECT_EQ(tensor_bytes(h, *h.find("tail")), std::string(small.begin(), small.end()));
}

TEST(Writer, RejectsBadInput) {
  TempDir dir;
  SafetensorsWriter w(dir / "x.safetensors");
  w.add("a", DType::U8, {1}, nullptr);
  EXPECT_EQ(expect_error<FormatError>([&] { w.add("a", DType::U8, {1}, nullptr); }).rule(),
            "duplicate-tensor");
  EXPECT_EQ(
      expect_error<FormatError>([&] { w.add("__metadata__", DType::U8, {1}, nullptr); }).rule(),
      "reserved-name");
  EXPECT_EQ(expect_error<FormatError>([&] { w.add("bad\xff", DType::U8, {1}, nullptr); }).rule(),
            "name-not-utf8");
  auto neg = expect_error<FormatError>([&] { w.add("n", DType::U8, {2, -1}, nullptr); });
  EXPECT_EQ(neg.rule(), "invalid-shape");
  EXPECT_EQ(neg.tensor(), "n");
  EXPECT_EQ(neg.file(), dir / "x.safetensors");
  EXPECT_EQ(expect_error<FormatError>([&] { w.add("f4", DType::F4, {3}, nullptr); }).rule(),
            "misaligned-size");
  EXPECT_EQ(expect_error<FormatError>([&] {
              w.add("o", DType::F32, {1ll << 40, 1ll << 40}, nullptr);
            }).rule(),
            "size-overflow");
  EXPECT_EQ(expect_error<FormatError>([&] {
              SafetensorsWriter(dir / "y", {{"k", "\xc0\x80"}});
            }).rule(),
            "invalid-metadata");
}

TEST(Writer, FailingSourceLeavesNoFile) {
  TempDir dir;
  SafetensorsWriter w(dir / "f.safetensors");
  w.add("ok", DType::U8, {4}, [](uint64_t, void* dst, uint64_t n) { std::memset(dst, 1, n); });
  w.add("boom", DType::U8, {4},
        [](uint64_t, void*, uint64_t) { throw std::runtime_error("disk on fire"); });
  auto e = expect_error<FormatError>([&] { w.write(); });
  EXPECT_EQ(e.rule(), "source-failed");
  EXPECT_EQ(e.tensor(), "boom");
  EXPECT_NE(std::string(e.what()).find("disk on fire"), std::string::npos);
  struct stat st;
  EXPECT_NE(::stat((dir / "f.safetensors").c_str(), &st), 0);
  EXPECT_NE(::stat((dir / "f.safetensors.tmp-" + std::to_string(::getpid())).c_str(), &st), 0);
}

TEST(Writer, UnwritableDirectoryIsAWriteError) {
  auto e = expect_error<FormatError>([] {
    SafetensorsWriter w("/nonexistent-dir-metaload/x.safetensors");
    w.write();
  });
  EXPECT_EQ(e.rule(), "write-failed");
}

TEST(PlanShards, MaxBytesAndCount) {
  ShardOptions by_bytes;
  by_bytes.max_shard_bytes = 10;
  EXPECT_EQ(plan_shards({4, 4, 4, 20, 1, 9}, by_bytes), (std::vector<size_t>{0, 2, 3, 4}));
  ShardOptions by_count;
  by_count.num_shards = 3;
  EXPECT_EQ(plan_shards({10, 10, 10, 10, 10, 10}, by_count), (std::vector<size_t>{0, 2, 4}));
  // Each shard keeps at least one tensor even when one tensor dominates.
  EXPECT_EQ(plan_shards({100, 1, 1}, by_count), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(plan_shards({1, 1, 1, 100}, by_count).size(), 3u);
  ShardOptions none;
  EXPECT_EQ(plan_shards({1, 2, 3}, none), (std::vector<size_t>{0}));
  by_count.num_shards = 4;
  EXPECT_EQ(expect_error<ShardError>([&] {
              plan_shards({1, 2, 3}, by_count);
            }).rule(),
            "invalid-options");
  ShardOptions both;
  both.num_shards = 2;
  both.max_shard_bytes = 5;
  EXPECT_EQ(expect_error<ShardError>([&] {
              plan_shards({1, 2, 3}, both);
            }).rule(),
            "invalid-options");
}

TEST(ShardedWriter, WritesShardsAndIndexThatOpenCheckpointAccepts) {
  TempDir dir;
  std::vector<std::vector<char>> data;
  ShardOptions o;
  o.max_shard_bytes = 100;
  o.metadata = {{"format", "pt"}};
  ShardedSafetensorsWriter w(dir.path(), o);
  for (int i = 0; i < 6; ++i) data.push_back(iota_bytes(40, i));
  for (int i = 0; i < 6; ++i)
    w.add("w" + std::to_string(i), DType::F32, {10}, [&, i](uint64_t off, void* dst, uint64_t n) {
      std::memcpy(dst, data[i].data() + off, n);
    });
  ShardedWriteResult r = w.write();
  ASSERT_EQ(r.files.size(), 3u);
  EXPECT_EQ(r.files[0], dir / "model-00001-of-00003.safetensors");
  EXPECT_EQ(r.index_path, dir / "model.safetensors.index.json");
  EXPECT_EQ(r.total_size, 240u);

  SafetensorsIndex idx = read_safetensors_index(r.index_path);
  EXPECT_EQ(idx.total_size, std::optional<uint64_t>(240));
  EXPECT_EQ(idx.weight_map.at("w0"), "model-00001-of-00003.safetensors");
  EXPECT_EQ(idx.weight_map.at("w5"), "model-00003-of-00003.safetensors");

  Checkpoint c = open_checkpoint(dir.path());
  EXPECT_EQ(c.files.size(), 3u);
  EXPECT_EQ(c.num_tensors(), 6u);
  EXPECT_EQ(c.data_bytes(), 240u);
  for (int i = 0; i < 6; ++i) {
    std::string name = "w" + std::to_string(i);
    const TensorInfo* t = c.find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(tensor_bytes(*c.file_of(name), *t), std::string(data[i].begin(), data[i].end()));
    EXPECT_EQ(c.file_of(name)->metadata.at("format"), "pt");
  }
}

TEST(ShardedWriter, SingleFileWhenItFitsAndIndexWhenAskedFor) {
  TempDir dir;
  ShardOptions o;
  o.max_shard_bytes = 1 << 20;
  ShardedSafetensorsWriter w(dir.path(), o);
  w.add("a", DType::U8, {3}, nullptr);
  ShardedWriteResult r = w.write();
  ASSERT_EQ(r.files.size(), 1u);
  EXPECT_EQ(r.files[0], dir / "model.safetensors");
  EXPECT_TRUE(r.index_path.empty());

  TempDir dir2;
  ShardOptions one;
  one.num_shards = 1;
  one.prefix = "diffusion_pytorch_model";
  ShardedSafetensorsWriter w2(dir2.path(), one);
  w2.add("a", DType::U8, {3}, nullptr);
  r = w2.write();
  EXPECT_EQ(r.files[0], dir2 / "diffusion_pytorch_model-00001-of-00001.safetensors");
  EXPECT_EQ(r.index_path, dir2 / "diffusion_pytorch_model.safetensors.index.json");
  EXPECT_EQ(open_checkpoint(dir2.path()).num_tensors(), 1u);

  EXPECT_EQ(expect_error<ShardError>([] {
              ShardedSafetensorsWriter("/nonexistent-metaload", {}).write();
            }).rule(),
            "not-a-directory");
}

}  // namespace
}  // namespace metaload
