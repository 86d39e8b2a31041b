// metaload's one error type. Every error carries a kind ("FormatError", "ResolveError", ...) and a
// message naming what is wrong and where. what() is "[metaload.<Kind>] <message>".
//
// Torch turns every C++ exception into a RuntimeError carrying what() alone, so each error also
// leaves its data in a small process-wide record when it is made: its kind, its message and what
// its class carries besides (a rule, a file, a tensor, lists of names; record_field). The Python
// package asks for the record of the what() it caught (error_data_json, the operator
// metaload::error_data) and builds metaload.<Kind> from that data, not from the text.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

 protected:
  // Adds what a subclass carries besides kind and message to this error's record, under `name`
  // (the Python attribute: "rule", "file", "missing", ...). Called from the subclass's constructor.
  void record_field(const char* name, const std::string& value) const;
  void record_field(const char* name, const std::vector<std::string>& values) const;

 private:
  Error(const char* kind, std::string&& safe, int)
      : std::runtime_error(std::string("[metaload.") + kind + "] " + safe),
        kind_(kind),
        message_(std::move(safe)),
        record_(record_error(what(), kind_, message_)) {}

  // Starts this error's record; returns its id (0 if it could not be kept).
  static uint64_t record_error(const char* what, const char* kind,
                               const std::string& message) noexcept;

  const char* kind_;
  std::string message_;
  uint64_t record_;  // copies share the record of the error they copy
};

// The data of the most recently made error whose what() is the longest found in `text` (what
// Python's str of the RuntimeError holds), as JSON: {"kind": ..., "message": ..., and each
// record_field}; or nullopt. The last kErrorRecordsKept errors are kept, process-wide, not per
// thread: an error made on a reader thread crosses to Python from the calling thread
// (std::exception_ptr). base/error.cc.
inline constexpr size_t kErrorRecordsKept = 16;
std::optional<std::string> error_data_json(const std::string& text);
// The same for the error whose what() is exactly `what`.
std::optional<std::string> error_data_json_exact(const std::string& what);

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
