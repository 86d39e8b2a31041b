// The safetensors header parser: dtypes, a valid header, and every validation rule.
#include "loader/format/safetensors.h"

#include <gtest/gtest.h>

#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;

SafetensorsHeader parse(const std::string& json, uint64_t data_bytes) {
  return parse_safetensors_header(json, 8 + json.size() + data_bytes, "mem.safetensors");
}

FormatError parse_error(const std::string& json, uint64_t data_bytes) {
  return expect_error<FormatError>([&] { parse(json, data_bytes); });
}

TEST(DType, EveryFormatDTypeHasNameAndBits) {
  const std::vector<std::pair<std::string, int>> expected = {
      {"BOOL", 8},    {"U8", 8},      {"I8", 8},          {"I16", 16},        {"U16", 16},
      {"F16", 16},    {"BF16", 16},   {"I32", 32},        {"U32", 32},        {"F32", 32},
      {"F64", 64},    {"I64", 64},    {"U64", 64},        {"C64", 64},        {"F8_E4M3", 8},
      {"F8_E5M2", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"F4", 4},
      {"F6_E2M3", 6}, {"F6_E3M2", 6}};
  ASSERT_EQ(all_dtypes().size(), expected.size());
  for (const auto& [name, bits] : expected) {
    auto d = dtype_from_name(name);
    ASSERT_TRUE(d) << name;
    EXPECT_EQ(dtype_name(*d), name);
    EXPECT_EQ(dtype_bits(*d), bits) << name;
  }
  EXPECT_FALSE(dtype_from_name("f32"));  // the format's names are case-sensitive
  EXPECT_FALSE(dtype_from_name("F128"));
  EXPECT_FALSE(dtype_from_name(""));
}

TEST(DType, TorchNamesRoundTripAndOnlyF4Packs) {
  for (DType d : all_dtypes()) {
    const std::string name = dtype_name(d);
    const char* attr = dtype_torch_attr(d);
    const char* scalar = dtype_scalar_name(d);
    EXPECT_EQ(dtype_torch_values(d), d == DType::F4 ? 2 : 1) << name;
    ASSERT_EQ(attr == nullptr, scalar == nullptr) << name;
    if (attr == nullptr) {  // no torch has F6_E2M3 or F6_E3M2
      EXPECT_EQ(name.rfind("F6_", 0), 0u) << name;
      continue;
    }
    EXPECT_TRUE(dtype_from_scalar_name(scalar) == d) << name;
    EXPECT_TRUE(dtype_from_torch_attr(attr) == d) << name;
  }
  EXPECT_STREQ(dtype_torch_attr(DType::F8_E4M3), "float8_e4m3fn");
  EXPECT_STREQ(dtype_scalar_name(DType::U8), "Byte");
  EXPECT_STREQ(dtype_torch_attr(DType::F4), "float4_e2m1fn_x2");
  EXPECT_FALSE(dtype_from_scalar_name("ComplexDouble"));
  EXPECT_FALSE(dtype_from_scalar_name("byte"));  // c10's spelling exactly
  EXPECT_FALSE(dtype_from_torch_attr("complex128"));
  EXPECT_FALSE(dtype_from_torch_attr("float"));  // an alias, not the attribute the table names
}

TEST(DType, TorchShapeHalvesF4sLastDimension) {
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(torch_shape_of(DType::F4, {3, 8}), Shape({3, 4}));
  EXPECT_EQ(torch_shape_of(DType::F4, {0}), Shape({0}));
  EXPECT_FALSE(torch_shape_of(DType::F4, {3, 7}));  // odd
  EXPECT_FALSE(torch_shape_of(DType::F4, {}));      // no last dimension
  EXPECT_EQ(torch_shape_of(DType::U8, {3, 7}), Shape({3, 7}));
  EXPECT_EQ(torch_shape_of(DType::F6_E2M3, {4}), Shape({4}));
  EXPECT_EQ(torch_shape_of(DType::F32, {}), Shape());
}

TEST(Header, ParsesTensorsInOffsetOrderWithMetadata) {
  // Written out of order on purpose; trailing spaces are the format's padding.
  std::string json = R"({"b":{"dtype":"F16","shape":[2],"data_offsets":[24,28]},)"
                     R"("__metadata__":{"format":"pt","note":"x"},)"
                     R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                     R"("s":{"dtype":"I64","shape":[],"data_offsets":[28,36]},)"
                     R"("z":{"dtype":"BF16","shape":[0,4],"data_offsets":[36,36]}}    )";
  SafetensorsHeader h = parse(json, 36);
  EXPECT_EQ(h.path, "mem.safetensors");
  EXPECT_EQ(h.header_size, json.size());
  EXPECT_EQ(h.data_start, 8 + json.size());
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[2].name, "s");
  EXPECT_EQ(h.tensors[3].name, "z");
  EXPECT_EQ(h.tensors[0].dtype, DType::F32);
  EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.tensors[0].numel(), 6);
  EXPECT_EQ(h.tensors[0].nbytes(), 24u);
  EXPECT_EQ(h.tensors[2].numel(), 1);  // a scalar
  EXPECT_EQ(h.tensors[3].numel(), 0);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.metadata.size(), 2u);
  ASSERT_NE(h.find("b"), nullptr);
  EXPECT_EQ(h.find("b")->begin, 24u);
  EXPECT_EQ(h.find("nope"), nullptr);
  EXPECT_EQ(h.data_size(), 36u);
}

TEST(Header, AcceptsEmptyNullMetadataAndUnknownFields) {
  SafetensorsHeader h = parse(R"({})", 0);
  EXPECT_TRUE(h.tensors.empty());
  h = parse(R"({"__metadata__":null,"t":{"dtype":"U8","shape":[3],"data_offsets":[0,3],)"
            R"("extra":{"nested":[1,[2,{"x":3}]]}}})",
            3);
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].nbytes(), 3u);
}

TEST(Header, SubByteDTypesMustFillWholeBytes) {
  auto h = parse(R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]},)"
                 R"("b":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[2,5]}})",
                 5);
  EXPECT_EQ(h.tensors[1].nbytes(), 3u);
  auto e = parse_error(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2);
  EXPECT_EQ(e.rule(), "misaligned-size");
  EXPECT_EQ(e.tensor(), "a");
}

TEST(Header, DuplicateTensorNamesAreReportedAsDuplicates) {
  auto e = parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                       2);
  EXPECT_EQ(e.rule(), "duplicate-tensor");
  EXPECT_EQ(e.tensor(), "w");
  EXPECT_EQ(e.kind(), std::string("FormatError"));
  EXPECT_NE(std::string(e.what()).find("[metaload.FormatError] mem.safetensors: tensor 'w'"),
            std::string::npos)
      << e.what();
  EXPECT_EQ(parse_error(R"({"w":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1)
                .rule(),
            "duplicate-key");
  EXPECT_EQ(parse_error(R"({"__metadata__":{"a":"1","a":"2"}})", 0).rule(), "duplicate-key");
}

struct RuleCase {
  const char* json;
  uint64_t data;
  const char* rule;
  const char* tensor;
};

class HeaderRule : public ::testing::TestWithParam<RuleCase> {};

TEST_P(HeaderRule, RejectsWithRuleAndTensor) {
  const RuleCase& c = GetParam();
  FormatError e = parse_error(c.json, c.data);
  EXPECT_EQ(e.rule(), c.rule) << e.what();
  EXPECT_EQ(e.tensor(), c.tensor) << e.what();
  EXPECT_EQ(e.file(), "mem.safetensors");
  EXPECT_NE(std::string(e.what()).find(std::string("(rule ") + c.rule + ")"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Rules, HeaderRule,
    ::testing::Values(
        RuleCase{"", 0, "header-not-object", ""}, RuleCase{" {}", 0, "header-not-object", ""},
        RuleCase{"[]", 0, "header-not-object", ""}, RuleCase{"{\"a\":}", 0, "invalid-json", ""},
        RuleCase{"{} x", 0, "invalid-json", ""},
        RuleCase{"{\"a\xff\":1}", 0, "header-not-utf8", ""},
        RuleCase{R"({"t":[1]})", 0, "entry-not-object", "t"},
        RuleCase{R"({"t":{"shape":[1],"data_offsets":[0,1]}})", 1, "missing-field", "t"},
        RuleCase{R"({"t":{"dtype":"U8","data_offsets":[0,1]}})", 1, "missing-field", "t"},
        RuleCase{R"({"t":{"dtype":"U8","shape":[1]}})", 1, "missing-field", "t"},
        RuleCase{R"({"t":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1, "unknown-dtype",
                 "t"},
        RuleCase{R"({"t":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1, "unknown-dtype", "t"},
        RuleCase{R"({"t":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1, "invalid-shape",
                 "t"},
        RuleCase{R"({"t":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1, "invalid-shape",
                 "t"},
        RuleCase{R"({"t":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})", 1, "invalid-shape",
                 "t"},
        RuleCase{R"({"t":{"dtype":"U8","shape":"1","data_offsets":[0,1]}})", 1, "invalid-shape",
                 "t"},
        RuleCase{R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1, "invalid-offsets",
                 "t"},
        RuleCase{R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 1, "invalid-offsets",
                 "t"},
        RuleCase{R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,-1]}})", 1, "invalid-offsets",
                 "t"},
        RuleCase{R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551616]}})", 1,
                 "invalid-offsets", "t"},
        RuleCase{R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})", 1, "offsets-reversed",
                 "t"},
        RuleCase{R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "size-mismatch",
                 "t"},
        RuleCase{R"({"t":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1]}})", 1,
                 "size-overflow", "t"},
        RuleCase{R"({"t":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,1]}})", 1,
                 "size-overflow", "t"},
        RuleCase{R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2,
                 "offsets-not-contiguous", "a"},
        RuleCase{R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                 R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                 3, "offsets-not-contiguous", "b"},
        RuleCase{R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 2, "trailing-bytes",
                 ""},
        RuleCase{R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 3, "data-truncated",
                 ""},
        RuleCase{R"({"__metadata__":["x"]})", 0, "invalid-metadata", ""},
        RuleCase{R"({"__metadata__":{"k":1}})", 0, "invalid-metadata", ""},
        RuleCase{R"({"__metadata__":{"k":{"n":"v"}}})", 0, "invalid-metadata", ""}));

TEST(ReadHeader, ReadsOnlyTheHeaderBytes) {
  testing::TempDir dir;
  std::string json = R"({"big":{"dtype":"U8","shape":[1048576],"data_offsets":[0,1048576]}})";
  testing::write_file(dir / "m.safetensors", testing::raw_safetensors(json, 1 << 20));
  reset_io_bytes_read();
  SafetensorsHeader h = read_safetensors_header(dir / "m.safetensors");
  EXPECT_EQ(io_bytes_read(), 8 + json.size());
  EXPECT_EQ(h.file_size, 8 + json.size() + (1 << 20));
  EXPECT_EQ(h.path, dir / "m.safetensors");
  ASSERT_EQ(h.tensors.size(), 1u);
}

TEST(ReadHeader, FileLevelRules) {
  testing::TempDir dir;
  testing::write_file(dir / "short", "abc");
  EXPECT_EQ(expect_error<FormatError>([&] { read_safetensors_header(dir / "short"); }).rule(),
            "file-too-small");

  std::string huge(8, '\0');
  uint64_t n = kMaxHeaderSize + 1;
  for (int i = 0; i < 8; ++i) huge[i] = static_cast<char>(n >> (8 * i));
  testing::write_file(dir / "huge", huge + "{}");
  EXPECT_EQ(expect_error<FormatError>([&] { read_safetensors_header(dir / "huge"); }).rule(),
            "header-too-large");

  std::string trunc = testing::raw_safetensors("{}      ", 0);
  testing::write_file(dir / "trunc", trunc.substr(0, trunc.size() - 3));
  EXPECT_EQ(expect_error<FormatError>([&] { read_safetensors_header(dir / "trunc"); }).rule(),
            "header-truncated");

  auto missing = expect_error<FormatError>([&] { read_safetensors_header(dir / "missing"); });
  EXPECT_EQ(missing.rule(), "unreadable");
  EXPECT_EQ(missing.file(), dir / "missing");

  EXPECT_EQ(expect_error<FormatError>([&] { read_safetensors_header(dir.path()); }).rule(),
            "not-a-file");
}

}  // namespace
}  // namespace metaload
