// The geometry of assembled targets (loader/load/assembly.h): the copies `assemble` plans are
// executed here on plain arrays and compared with the operations done by hand (stack, cat,
// chunk, transpose), so a wrong offset, stride or order shows as a wrong element.
#include "loader/load/assembly.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "loader/errors.h"

namespace metaload {
namespace {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<int64_t>());
}

// Leaf k holds the values k * 1000 + i (i its flat index), so every element says where it came
// from.
std::vector<std::vector<int>> leaves_data(const std::vector<Shape>& shapes) {
  std::vector<std::vector<int>> out;
  for (size_t k = 0; k < shapes.size(); ++k) {
    std::vector<int> v(static_cast<size_t>(numel(shapes[k])));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int>(k * 1000 + i);
    out.push_back(v);
  }
  return out;
}

// Runs the planned copies; -1 marks an element nothing wrote, and writing one twice fails.
std::vector<int> run(const AssembledTarget& t, const std::vector<std::vector<int>>& leaves) {
  std::vector<int> out(static_cast<size_t>(numel(t.shape)), -1);
  for (const AssembledCopy& c : t.copies) {
    for (uint64_t r = 0; r < c.rows; ++r) {
      for (uint64_t e = 0; e < c.row_elems; ++e) {
        int& dst = out.at(c.dst_offset + r * c.dst_stride + e);
        EXPECT_EQ(dst, -1) << "element written twice";
        dst = leaves[c.leaf].at(c.src_offset + r * c.src_stride + e);
      }
    }
  }
  return out;
}

Assembly experts(int n, const std::vector<AssemblyOp>& ops, std::vector<std::string> patterns) {
  Assembly a;
  a.model_type = "mixtral";
  a.targets = {"layers.0.mlp.experts.gate_up_proj"};
  a.ops = ops;
  for (const std::string& p : patterns) {
    AssemblySource s;
    s.pattern = ".experts.*." + p + ".weight";
    s.name_template = "layers.0.block_sparse_moe.experts.*." + p + ".weight";
    for (int e = 0; e < n; ++e) {
      s.names.push_back("layers.0.block_sparse_moe.experts." + std::to_string(e) + "." + p +
                        ".weight");
      s.indices.push_back(e);
    }
    a.sources.push_back(s);
  }
  return a;
}

TEST(Assembly, MergeThenConcatenateIsStackThenCat) {
  // Mixtral: w1 and w3 [I=3, H=4] of E=2 experts -> gate_up_proj [2, 6, 4]:
  // gate_up[e] = cat(w1[e], w3[e]) along dim 0 of the expert's slab.
  const Assembly a = experts(2, {{"MergeModulelist", 0}, {"Concatenate", 1}}, {"w1", "w3"});
  const std::vector<Shape> shapes(4, Shape{3, 4});
  const AssemblyResult r = assemble(a, shapes);
  ASSERT_TRUE(r.problem.empty()) << r.problem;
  ASSERT_EQ(r.targets.size(), 1u);
  EXPECT_EQ(r.targets[0].shape, (Shape{2, 6, 4}));
  const auto data = leaves_data(shapes);
  const std::vector<int> got = run(r.targets[0], data);
  // Leaves in order: w1 of experts 0, 1, then w3 of experts 0, 1.
  for (int e = 0; e < 2; ++e)
    for (int row = 0; row < 6; ++row)
      for (int h = 0; h < 4; ++h) {
        const int leaf = row < 3 ? e : 2 + e;
        const int want = leaf * 1000 + (row % 3) * 4 + h;
        EXPECT_EQ(got[static_cast<size_t>((e * 6 + row) * 4 + h)], want) << e << " " << row;
      }
  // Each expert's half is one contiguous run: one copy per leaf.
  EXPECT_EQ(r.targets[0].copies.size(), 4u);
}

TEST(Assembly, ConcatenateAlongTheLastDimCopiesStridedRows) {
  const Assembly a = experts(2, {{"MergeModulelist", 0}, {"Concatenate", 2}}, {"w1", "w3"});
  const std::vector<Shape> shapes(4, Shape{3, 4});
  const AssemblyResult r = assemble(a, shapes);
  ASSERT_TRUE(r.problem.empty()) << r.problem;
  EXPECT_EQ(r.targets[0].shape, (Shape{2, 3, 8}));
  const std::vector<int> got = run(r.targets[0], leaves_data(shapes));
  for (int e = 0; e < 2; ++e)
    for (int i = 0; i < 3; ++i)
      for (int c = 0; c < 8; ++c) {
        const int leaf = c < 4 ? e : 2 + e;
        EXPECT_EQ(got[static_cast<size_t>((e * 3 + i) * 8 + c)], leaf * 1000 + i * 4 + c % 4);
      }
}

TEST(Assembly, MergeAlongAnInnerDim) {
  // stack(dim=1) of [3, 4] tensors -> [3, E, 4]: rows of 4 from each expert interleave.
  const Assembly a = experts(3, {{"MergeModulelist", 1}}, {"w2"});
  const std::vector<Shape> shapes(3, Shape{3, 4});
  const AssemblyResult r = assemble(a, shapes);
  ASSERT_TRUE(r.problem.empty()) << r.problem;
  EXPECT_EQ(r.targets[0].shape, (Shape{3, 3, 4}));
  const std::vector<int> got = run(r.targets[0], leaves_data(shapes));
  for (int i = 0; i < 3; ++i)
    for (int e = 0; e < 3; ++e)
      for (int h = 0; h < 4; ++h)
        EXPECT_EQ(got[static_cast<size_t>((i * 3 + e) * 4 + h)], e * 1000 + i * 4 + h);
}

TEST(Assembly, ChunkSplitsOneTensorIntoTheTargets) {
  // A fused qkv [6, 4] checkpoint tensor -> q, k, v [2, 4]; and along dim 1 -> [6, 2] each.
  for (int dim : {0, 1}) {
    Assembly a;
    a.model_type = "t";
    a.targets = {"q", "k"};
    a.ops = {{"Chunk", dim}};
    a.sources = {{"qkv", {"qkv.weight"}, {}, ""}};
    const std::vector<Shape> shapes{{6, 4}};
    const AssemblyResult r = assemble(a, shapes);
    ASSERT_TRUE(r.problem.empty()) << r.problem;
    ASSERT_EQ(r.targets.size(), 2u);
    const auto data = leaves_data(shapes);
    for (int c = 0; c < 2; ++c) {
      const std::vector<int> got = run(r.targets[static_cast<size_t>(c)], data);
      if (dim == 0) {
        EXPECT_EQ(r.targets[static_cast<size_t>(c)].shape, (Shape{3, 4}));
        for (int i = 0; i < 12; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], c * 12 + i);
      } else {
        EXPECT_EQ(r.targets[static_cast<size_t>(c)].shape, (Shape{6, 2}));
        for (int i = 0; i < 6; ++i)
          for (int j = 0; j < 2; ++j)
            EXPECT_EQ(got[static_cast<size_t>(i * 2 + j)], i * 4 + c * 2 + j);
      }
    }
  }
}

TEST(Assembly, TransposeOfOuterDimsStreamsAndOfTheLastDimCopiesElements) {
  Assembly a = experts(2, {{"MergeModulelist", 0}, {"Transpose", 0, 1}}, {"w2"});
  const std::vector<Shape> shapes(2, Shape{3, 4});
  const AssemblyResult r = assemble(a, shapes);
  ASSERT_TRUE(r.problem.empty()) << r.problem;
  EXPECT_EQ(r.targets[0].shape, (Shape{3, 2, 4}));
  const std::vector<int> got = run(r.targets[0], leaves_data(shapes));
  for (int i = 0; i < 3; ++i)
    for (int e = 0; e < 2; ++e)
      for (int h = 0; h < 4; ++h)
        EXPECT_EQ(got[static_cast<size_t>((i * 2 + e) * 4 + h)], e * 1000 + i * 4 + h);

  // check_dims: already the module's shape, the transpose is skipped (as transformers does).
  a.ops = {{"MergeModulelist", 0}, {"Transpose", 1, 2, /*check_dims=*/true}};
  const AssemblyResult same = assemble(a, shapes, {{2, 3, 4}});
  ASSERT_TRUE(same.problem.empty());
  EXPECT_EQ(same.targets[0].shape, (Shape{2, 3, 4}));

  // Swapping the last dim copies element by element (rows of one element), still exactly.
  a.ops = {{"MergeModulelist", 0}, {"Transpose", 1, 2}};
  const AssemblyResult t = assemble(a, shapes);
  ASSERT_TRUE(t.problem.empty()) << t.problem;
  EXPECT_EQ(t.targets[0].shape, (Shape{2, 4, 3}));
  for (const AssembledCopy& c : t.targets[0].copies) EXPECT_EQ(c.row_elems, 1u);
  const std::vector<int> tr = run(t.targets[0], leaves_data(shapes));
  for (int e = 0; e < 2; ++e)
    for (int h = 0; h < 4; ++h)
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(tr[static_cast<size_t>((e * 4 + h) * 3 + i)], e * 1000 + i * 4 + h);
}

TEST(Assembly, AWindowTakesARanksPartReadingOnlyItsRows) {
  // gate_up_proj [3, 4, 2] from w1/w3 [2, 2] of 3 experts.
  const Assembly a = experts(3, {{"MergeModulelist", 0}, {"Concatenate", 1}}, {"w1", "w3"});
  const std::vector<Shape> shapes(6, Shape{2, 2});
  const auto data = leaves_data(shapes);
  const std::vector<int> full = run(assemble(a, shapes).targets[0], data);
  // Expert parallelism: expert 1 alone; its copies read leaves 1 and 4 only.
  TpShard ep{0, {{1, 2}}, {1, 4, 2}};
  const AssemblyResult r = assemble(a, shapes, {}, {ep});
  ASSERT_TRUE(r.problem.empty()) << r.problem;
  EXPECT_EQ(r.targets[0].shape, (Shape{1, 4, 2}));
  for (const AssembledCopy& c : r.targets[0].copies) EXPECT_TRUE(c.leaf == 1 || c.leaf == 4);
  const std::vector<int> got = run(r.targets[0], data);
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(got[static_cast<size_t>(i)], full[static_cast<size_t>(8 + i)]);
  // Packed column parallelism: row 0 of each half (gate's and up's first output) of every expert.
  TpShard packed{1, {{0, 1}, {2, 3}}, {3, 2, 2}};
  const AssemblyResult p = assemble(a, shapes, {}, {packed});
  ASSERT_TRUE(p.problem.empty()) << p.problem;
  const std::vector<int> pg = run(p.targets[0], data);
  for (int e = 0; e < 3; ++e)
    for (int k = 0; k < 2; ++k)
      for (int h = 0; h < 2; ++h)
        EXPECT_EQ(pg[static_cast<size_t>((e * 2 + k) * 2 + h)],
                  full[static_cast<size_t>((e * 4 + k * 2) * 2 + h)]);
  // A range outside the dim is refused, naming the target.
  EXPECT_THROW(assemble(a, shapes, {}, {TpShard{0, {{2, 4}}, {}}}), PlanError);
}

TEST(Assembly, PermuteForRopeReordersEachHeadsRowsOfTheValuesItAppliesTo) {
  // A fused qkv [3 * 8, 3] -> q, k, v [8, 3]: 2 heads of 4 rows (each viewed as [2, 2] and
  // transposed: rows 0 1 2 3 -> 0 2 1 3); q and k permuted, v as it is.
  Assembly a;
  a.model_type = "kimi_k25";
  a.targets = {"attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight"};
  AssemblyOp permute{"PermuteForRope", 0};
  permute.n_heads = 2;
  permute.applies = {true, true, false};
  a.ops = {{"Chunk", 0}, permute};
  a.sources = {{"wqkv", {"wqkv"}, {}, ""}};
  const std::vector<Shape> shapes{{24, 3}};
  const AssemblyResult r = assemble(a, shapes);
  ASSERT_TRUE(r.problem.empty()) << r.problem;
  const auto data = leaves_data(shapes);
  const int order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int c = 0; c < 3; ++c) {
    const std::vector<int> got = run(r.targets[static_cast<size_t>(c)], data);
    for (int row = 0; row < 8; ++row) {
      const int src = c < 2 ? order[row] : row;
      for (int e = 0; e < 3; ++e) {
        EXPECT_EQ(got[static_cast<size_t>(row * 3 + e)], c * 24 + src * 3 + e)
            << "target " << c << " row " << row;
      }
    }
  }
}

TEST(Assembly, PermuteForRopeOfSixRowHeadsMatchesTheReshape) {
  // One q [12] bias (1-D) and a q [12, 2] weight, 2 heads of 6: forward views each head as
  // [3, 2], inverse as [2, 3]; the result is the transpose, read row by row.
  for (bool inverse : {false, true}) {
    for (const Shape& shape : {Shape{12}, Shape{12, 2}}) {
      Assembly a;
      a.model_type = "t";
      a.targets = {"q_proj"};
      AssemblyOp permute{"PermuteForRope", 0};
      permute.n_heads = 2;
      permute.inverse = inverse;
      a.ops = {permute};
      a.sources = {{"q", {"q"}, {}, ""}};
      const AssemblyResult r = assemble(a, {shape});
      ASSERT_TRUE(r.problem.empty()) << r.problem;
      const std::vector<int> got = run(r.targets[0], leaves_data({shape}));
      const int64_t inner = shape.size() == 2 ? shape[1] : 1;
      const int va = inverse ? 2 : 3, vb = inverse ? 3 : 2;  // the head viewed as [va, vb]
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < vb; ++j)
          for (int i = 0; i < va; ++i)
            for (int64_t e = 0; e < inner; ++e) {
              const int64_t out_row = h * 6 + j * va + i, in_row = h * 6 + i * vb + j;
              EXPECT_EQ(got[static_cast<size_t>(out_row * inner + e)], in_row * inner + e);
            }
    }
  }
}

TEST(Assembly, PermuteForRopeOfHeadsThatDoNotDivideIsAPlanError) {
  Assembly a;
  a.model_type = "kimi_k25";
  a.targets = {"q_proj"};
  AssemblyOp permute{"PermuteForRope", 0};
  permute.n_heads = 4;
  a.ops = {permute};
  a.sources = {{"q", {"q"}, {}, ""}};
  EXPECT_THROW(assemble(a, {Shape{12, 2}}), PlanError);  // heads of 3 rows: odd
  permute.n_heads = 0;
  a.ops = {permute};
  EXPECT_THROW(assemble(a, {Shape{12, 2}}), PlanError);
}

TEST(Assembly, InterleaveOfADimPutsItsEvenIndicesFirstOrInterleavesThemAgain) {
  // Fused experts [2, 6, 3] (MergeModulelist of two [6, 3]) interleaved along dim 1: the 6 rows
  // viewed as [3, 2] (inverse: [2, 3]) and transposed, each expert on its own.
  for (bool inverse : {false, true}) {
    AssemblyOp op{"Interleave", 1};
    op.inverse = inverse;
    Assembly a = experts(2, {{"MergeModulelist", 0}, op}, {"w1"});
    const std::vector<Shape> shapes(2, Shape{6, 3});
    const AssemblyResult r = assemble(a, shapes);
    ASSERT_TRUE(r.problem.empty()) << r.problem;
    const std::vector<int> got = run(r.targets[0], leaves_data(shapes));
    const int va = inverse ? 2 : 3, vb = inverse ? 3 : 2;
    for (int e = 0; e < 2; ++e)
      for (int j = 0; j < vb; ++j)
        for (int i = 0; i < va; ++i)
          for (int c = 0; c < 3; ++c) {
            const int out_row = j * va + i, in_row = i * vb + j;
            EXPECT_EQ(got[static_cast<size_t>((e * 6 + out_row) * 3 + c)],
                      e * 1000 + in_row * 3 + c)
                << "inverse " << inverse << " expert " << e << " row " << out_row;
          }
  }
  // An odd dim is the checkpoint's misfit, named.
  Assembly odd = experts(1, {{"MergeModulelist", 0}, {"Interleave", 1}}, {"w1"});
  const AssemblyResult r = assemble(odd, {Shape{5, 3}});
  EXPECT_NE(r.problem.find("odd dim 1"), std::string::npos) << r.problem;
  // The innermost dim too, element by element: [1, 2, 4] -> columns 0 2 1 3 of each row.
  Assembly last = experts(1, {{"MergeModulelist", 0}, {"Interleave", 2}}, {"w1"});
  const AssemblyResult l = assemble(last, {Shape{2, 4}});
  ASSERT_TRUE(l.problem.empty()) << l.problem;
  const std::vector<int> lv = run(l.targets[0], leaves_data({Shape{2, 4}}));
  EXPECT_EQ(lv, (std::vector<int>{0, 2, 1, 3, 4, 6, 5, 7}));
}

TEST(Assembly, ErnieSplitsEachSourcesExpertsAmongTheTargetsAndFusesThem) {
  // gate and up, 4 experts of [3, 4] each -> text (experts 0, 1) and vision (2, 3), each
  // cat(stack(gate group), stack(up group), dim=1): [2, 6, 4].
  Assembly a = experts(4, {{"ErnieFuseAndSplitTextVisionExperts", 0, 1}}, {"gate", "up"});
  a.targets = {"text_moe.experts.gate_up_proj", "vision_moe.experts.gate_up_proj"};
  const std::vector<Shape> shapes(8, Shape{3, 4});
  const AssemblyResult r = assemble(a, shapes);
  ASSERT_TRUE(r.problem.empty()) << r.problem;
  const auto data = leaves_data(shapes);
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(r.targets[static_cast<size_t>(t)].shape, (Shape{2, 6, 4}));
    const std::vector<int> got = run(r.targets[static_cast<size_t>(t)], data);
    for (int e = 0; e < 2; ++e)
      for (int row = 0; row < 6; ++row)
        for (int c = 0; c < 4; ++c) {
          const int leaf = (row < 3 ? 0 : 4) + t * 2 + e;  // gate leaves 0-3, up leaves 4-7
          EXPECT_EQ(got[static_cast<size_t>((e * 6 + row) * 4 + c)],
                    leaf * 1000 + (row % 3) * 4 + c)
              << "target " << t << " expert " << e << " row " << row;
        }
  }
}

TEST(Assembly, AnOperationItCannotDoIsAPlanErrorNamingItAndTheModelType) {
  Assembly a = experts(2, {{"MergeModulelist", 0}, {"SplitModulelist", 0}}, {"w1"});
  try {
    assemble(a, std::vector<Shape>(2, Shape{3, 4}));
    FAIL() << "no error";
  } catch (const PlanError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("SplitModulelist"), std::string::npos) << m;
    EXPECT_NE(m.find("'mixtral'"), std::string::npos) << m;
    EXPECT_NE(m.find("gate_up_proj"), std::string::npos) << m;
  }
}

TEST(Assembly, ALackingExpertIsNamed) {
  Assembly a = experts(4, {{"MergeModulelist", 0}, {"Concatenate", 1}}, {"w1", "w3"});
  // w3 lacks expert 2.
  a.sources[1].names.erase(a.sources[1].names.begin() + 2);
  a.sources[1].indices.erase(a.sources[1].indices.begin() + 2);
  const AssemblyResult r = assemble(a, std::vector<Shape>(7, Shape{3, 4}));
  EXPECT_TRUE(r.targets.empty());
  EXPECT_NE(r.problem.find("'layers.0.block_sparse_moe.experts.2.w3.weight'"), std::string::npos)
      << r.problem;
  EXPECT_NE(r.problem.find("3 of 4 experts"), std::string::npos) << r.problem;
}

TEST(Assembly, AnExpertOfTheWrongShapeIsNamed) {
  const Assembly a = experts(3, {{"MergeModulelist", 0}}, {"w2"});
  const AssemblyResult r = assemble(a, {{3, 4}, {3, 4}, {3, 5}});
  EXPECT_TRUE(r.targets.empty());
  EXPECT_NE(r.problem.find("'layers.0.block_sparse_moe.experts.2.w2.weight' is [3, 5]"),
            std::string::npos)
      << r.problem;
}

TEST(Assembly, ParseRejectsMalformedInputNamingIt) {
  EXPECT_THROW(parse_assemblies("{"), PlanError);
  EXPECT_THROW(parse_assemblies("{}"), PlanError);
  try {
    parse_assemblies(R"([{"targets": "x", "sources": [], "ops": []}])");
    FAIL() << "no error";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("'targets'"), std::string::npos) << e.what();
  }
  const std::vector<Assembly> ok = parse_assemblies(
      R"([{"model_type": "m", "targets": ["t"], "sources": [{"pattern": "p", "names": ["a", "b"],
          "indices": [0, 1], "template": "*"}], "ops": [{"op": "MergeModulelist", "dim": 0}]}])");
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].sources[0].names.size(), 2u);
  EXPECT_EQ(ok[0].ops[0].op, "MergeModulelist");
}

}  // namespace
}  // namespace metaload
