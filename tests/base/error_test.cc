#include "base/error.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace metaload
