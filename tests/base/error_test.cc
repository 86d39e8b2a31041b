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
