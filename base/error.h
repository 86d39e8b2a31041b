// metaload's one error type. Every error carries a kind ("FormatError", "ResolveError", ...) and a
// message naming what is wrong and where. what() is "[metaload.<Kind>] <message>": the prefix lets
// the Python package re-raise the matching metaload.<Kind> exception, since torch turns every C++
// exception into a RuntimeError carrying what().
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include "base/text.h"

namespace metaload {

class Error : public std::runtime_error {
 public:
  // The message is kept valid UTF-8 (utf8_safe: a byte that is not UTF-8 becomes "\xNN"): torch
  // hands what() to Python as a str, and one raw byte quoted from a file would lose it all.
  Error(const char* kind, const std::string& message) : Error(kind, utf8_safe(message), 0) {}

  // The kind, e.g. "FormatError"; the name of the Python exception class too.
  const char* kind() const noexcept { return kind_; }
  // The message without the "[metaload.<Kind>] " prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  Error(const char* kind, std::string&& safe, int)
      : std::runtime_error(std::string("[metaload.") + kind + "] " + safe),
        kind_(kind),
        message_(std::move(safe)) {}

  const char* kind_;
  std::string message_;
};

}  // namespace metaload

// Declares `class Name : public Base` whose kind is "Name". Subclasses of subclasses keep their own
// kind, so catching a base catches them all while what() names the most precise one.
#define METALOAD_DEFINE_ERROR(Name, Base)                                       \
  class Name : public Base {                                                    \
   public:                                                                      \
    explicit Name(const std::string& message) : Base(#Name, message) {}         \
                                                                                \
   protected:                                                                   \
    Name(const char* kind, const std::string& message) : Base(kind, message) {} \
  }

namespace metaload {

// The kinds of the base layer and of the dispatch-key mode, in one place: the kernels raise the
// mode's DataDependentError too, and kernels/ must not depend on c10_ext/ (CONTRIBUTING.md).

// A size computed from inputs (a checkpoint, a config, a batch) does not fit in 64 bits (63 for
// signed sizes). The message names the quantity and the operands (base/checked.h).
METALOAD_DEFINE_ERROR(SizeOverflowError, Error);
// A mode entered or left in the wrong order or on the wrong thread, or its dispatch key taken
// (c10_ext/mode_key.h).
METALOAD_DEFINE_ERROR(ModeError, Error);
// A tensor's values were needed (item(), nonzero(), printing, ...) but it lives on meta.
METALOAD_DEFINE_ERROR(DataDependentError, Error);

}  // namespace metaload
