// base/torch_library: a warning of the library's load, in a C++ program (no Python interpreter in
// the process), is a torch warning at once -- what c10's handler prints -- and nothing is kept
// for the Python package to raise later (tests/python/test_mode.py covers that side).
#include "base/torch_library.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/torch_compat.h"

namespace metaload {
namespace {

struct Recorder : compat::WarningMessageHandler {
  std::vector<std::string> seen;
  void on_warning(const std::string& message) override { seen.push_back(message); }
};

TEST(LoadWarning, OutsidePythonIsATorchWarningAtOnce) {
  Recorder recorder;
  {
    compat::WarningHandlerGuard guard(&recorder);
    load_warning("metaload: a test warning");
  }
  ASSERT_EQ(recorder.seen.size(), 1u);
  EXPECT_EQ(recorder.seen[0], "metaload: a test warning");
  EXPECT_TRUE(take_load_warnings().empty());
}

}  // namespace
}  // namespace metaload
