// The dtype names a model runs in: the CLI's --dtype and TransformersModel's dtype both go through
// the one table (identity/dtypes.h) and the one torch mapping (identity/model_dtype.h).
#include <gtest/gtest.h>

#include <string>

#include "identity/model_dtype.h"
#include "tests/loader/test_util.h"
#include "tools/cli/torch/torch_cli.h"

namespace metaload {
namespace {

using testing::expect_error;

TEST(ModelDType, EveryTableNameMapsTheSameForTheCliAndTheModel) {
  int accepted = 0;
  for (const std::string& name : accepted_dtype_names()) {
    bool runnable = false;
    for (std::string_view m : MODEL_DTYPES) runnable |= resolve_dtype_name(name).torch_name == m;
    if (!runnable) {
      expect_error<DTypeError>([&] { model_scalar_type(name); });
      auto e = expect_error<cli::UsageError>([&] { cli::parse_model_dtype(name, "--dtype"); });
      EXPECT_NE(std::string(e.what()).find("--dtype"), std::string::npos) << name;
      continue;
    }
    ++accepted;
    EXPECT_EQ(cli::parse_model_dtype(name, "--dtype"), model_scalar_type(name)) << name;
    EXPECT_EQ(cli::parse_model_dtype("torch." + name, "--dtype"), model_scalar_type(name)) << name;
  }
  // float32/float, float64/double, float16/half, bfloat16 and the file names f32, f64, f16, bf16.
  EXPECT_EQ(accepted, 11);
}

TEST(ModelDType, Float64IsAcceptedByBoth) {
  for (const char* n : {"float64", "double", "torch.float64", "F64"}) {
    EXPECT_EQ(model_scalar_type(n), c10::kDouble) << n;
    EXPECT_EQ(cli::parse_model_dtype(n, "--dtype"), c10::kDouble) << n;
  }
  EXPECT_EQ(model_scalar_type("half"), c10::kHalf);
  EXPECT_EQ(model_scalar_type("bf16"), c10::kBFloat16);
  EXPECT_EQ(model_scalar_type("float"), c10::kFloat);
}

TEST(ModelDType, OtherNamesAreRefusedNamingTheRunnableDTypes) {
  for (const char* n : {"int8", "nf4", "complex64", "uint8"}) {
    auto e = expect_error<DTypeError>([&] { model_scalar_type(n); });
    const std::string m = e.what();
    EXPECT_NE(m.find(std::string("'") + n + "'"), std::string::npos) << m;
    for (std::string_view d : MODEL_DTYPES) EXPECT_NE(m.find(d), std::string::npos) << m;
  }
  // Unknown names: the table's own error with the accepted list.
  auto e = expect_error<DTypeError>([] { model_scalar_type("float13"); });
  EXPECT_NE(std::string(e.what()).find("accepted"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace metaload
