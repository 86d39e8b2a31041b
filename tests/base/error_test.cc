#include "base/error.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace metaload {
namespace {

METALOAD_DEFINE_ERROR(ParentError, Error);
METALOAD_DEFINE_ERROR(ChildError, ParentError);

TEST(Error, WhatCarriesKindPrefixAndMessage) {
  ChildError e("tensor 'w' in a.safetensors: offsets overlap");
  EXPECT_STREQ(e.what(), "[metaload.ChildError] tensor 'w' in a.safetensors: offsets overlap");
  EXPECT_STREQ(e.kind(), "ChildError");
  EXPECT_EQ(e.message(), "tensor 'w' in a.safetensors: offsets overlap");
}

TEST(Error, MessagesAreAlwaysValidUtf8) {
  // A raw byte quoted from a file (nlohmann's parse errors quote the byte they stopped at) would
  // make torch's str of what() fail, and Python would get RuntimeError('').
  ChildError e("config.json: last read: '\"\xff' at \xc3\xa9");
  EXPECT_STREQ(e.what(), "[metaload.ChildError] config.json: last read: '\"\\xff' at \xc3\xa9");
  EXPECT_EQ(e.message(), "config.json: last read: '\"\\xff' at \xc3\xa9");
}

TEST(Error, CatchingTheBaseCatchesTheChildAndKeepsItsKind) {
  try {
    throw ChildError("x");
  } catch (const ParentError& e) {
    EXPECT_STREQ(e.kind(), "ChildError");
  }
  EXPECT_THROW(throw ParentError("y"), Error);
}

// A kind with a field, as FormatError and MismatchError record theirs.
class FieldError : public Error {
 public:
  FieldError(const std::string& message, const std::string& rule,
             const std::vector<std::string>& names)
      : Error("FieldError", message) {
    record_field("rule", rule);
    record_field("names", names);
  }
};

TEST(ErrorRecord, AnErrorLeavesItsKindMessageAndFieldsForPython) {
  FieldError e("a.st: bad (rule r-1)", "r-1", {"w", "b\nx", "c"});
  // Python holds what() inside torch's text; the record is found by it.
  std::optional<std::string> data =
      error_data_json(std::string("prefix ") + e.what() + "\nException raised from x");
  ASSERT_TRUE(data.has_value());
  EXPECT_EQ(*data,
            R"j({"kind":"FieldError","message":"a.st: bad (rule r-1)","names":["w","b\nx","c"],)j"
            R"j("rule":"r-1"})j");
  EXPECT_EQ(error_data_json_exact(e.what()), data);
  EXPECT_FALSE(error_data_json_exact(std::string(e.what()) + " ").has_value());
  EXPECT_FALSE(error_data_json("[metaload.FieldError] a.st: other").has_value());
}

TEST(ErrorRecord, TheLongestWhatInTheTextWinsAndOnlyTheLastFewAreKept) {
  ChildError inner("x");
  ChildError outer("x and more");  // its text holds inner's what() too
  EXPECT_NE(error_data_json(outer.what())->find("x and more"), std::string::npos);
  EXPECT_NE(error_data_json(inner.what())->find(R"j("message":"x")j"), std::string::npos);
  for (size_t i = 0; i < kErrorRecordsKept; ++i) ChildError("filler " + std::to_string(i));
  EXPECT_FALSE(error_data_json(outer.what()).has_value());
  EXPECT_TRUE(error_data_json(ChildError("fresh").what()).has_value());
}

TEST(ErrorRecord, NamesThatAreNotUtf8StillMakeValidJson) {
  FieldError e("m", "r", {"a\xff"});
  std::optional<std::string> data = error_data_json_exact(e.what());
  ASSERT_TRUE(data.has_value());
  EXPECT_NE(data->find("\"a\xef\xbf\xbd\""), std::string::npos) << *data;  // U+FFFD
}

}  // namespace
}  // namespace metaload
