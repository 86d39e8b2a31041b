// Numbers on the command line, read one way by every subcommand: CLI11 validators that read the
// text exactly (decimal digits only: no clamping of 99999999999999999999, no octal "010", no
// floating-point ranges) and say ranges in words.
#include <charconv>
#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/text.h"
#include "tools/cli/command.h"

namespace metaload {
namespace cli {
namespace {

std::string bound_words(int64_t v) {
  if (v == INT64_MAX) return "2^63-1";
  if (v == INT_MAX) return "2^31-1";
  return std::to_string(v);
}

std::string_view trimmed(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

enum class Parsed { kOk, kNotANumber, kTooLarge };

// Decimal digits with an optional sign; kTooLarge when the value does not fit in T.
template <typename T>
Parsed parse_decimal(std::string_view s, T* out) {
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.empty() || s.find_first_not_of("0123456789") != std::string_view::npos) {
    return Parsed::kNotANumber;
  }
  uint64_t magnitude = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), magnitude);
  if (r.ec == std::errc::result_out_of_range) return Parsed::kTooLarge;
  if constexpr (std::is_unsigned_v<T>) {
    if (negative && magnitude != 0) return Parsed::kTooLarge;  // below the range
    *out = magnitude;
  } else {
    if (negative) {
      if (magnitude > static_cast<uint64_t>(INT64_MAX) + 1) return Parsed::kTooLarge;
      *out = static_cast<T>(0 - magnitude);
    } else {
      if (magnitude > static_cast<uint64_t>(INT64_MAX)) return Parsed::kTooLarge;
      *out = static_cast<T>(magnitude);
    }
  }
  return Parsed::kOk;
}

// The value as the user wrote it, for an error message (escaped, cut).
std::string shown(std::string_view text) {
  return quote_text(text, '\'', 40);
}

}  // namespace

std::string range_words(int64_t lo, int64_t hi) {
  return "a whole number from " + bound_words(lo) + " to " + bound_words(hi);
}

CLI::Validator whole_number(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t v = 0;
        const Parsed p = parse_decimal(trimmed(text), &v);
        if (p == Parsed::kNotANumber) return shown(text) + " is not " + range_words(lo, hi);
        if (p == Parsed::kTooLarge || v < lo || v > hi) {
          return shown(text) + " is out of range: " + range_words(lo, hi);
        }
        text = std::to_string(v);  // what CLI11 converts: exactly this decimal number
        return "";
      },
      "[" + bound_words(lo) + ", " + bound_words(hi) + "]");
}

CLI::Validator whole_number_u64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const std::string words = "a whole number from 0 to 2^64-1";
        uint64_t v = 0;
        const Parsed p = parse_decimal(trimmed(text), &v);
        if (p == Parsed::kNotANumber) return shown(text) + " is not " + words;
        if (p == Parsed::kTooLarge) return shown(text) + " is out of range: " + words;
        text = std::to_string(v);
        return "";
      },
      "[0, 2^64-1]");
}

std::string parse_token_ids(const std::string& text, bool several,
                            std::vector<std::vector<int64_t>>* rows) {
  rows->clear();
  if (trimmed(text).empty()) return "no token ids";
  // Every separator separates: "1,2;" has an empty second sequence, as "1;;2" has, and
  // "1,,2" an empty item; none of them is accepted.
  std::vector<std::string_view> sequences;
  std::string_view rest = text;
  for (size_t at; (at = rest.find(';')) != std::string_view::npos; rest.remove_prefix(at + 1)) {
    sequences.push_back(rest.substr(0, at));
  }
  sequences.push_back(rest);
  if (!several && sequences.size() > 1) return "takes one sequence of ids (no ';')";
  for (size_t s = 0; s < sequences.size(); ++s) {
    const std::string where = sequences.size() > 1 ? "sequence " + std::to_string(s + 1) : "";
    if (trimmed(sequences[s]).empty()) {
      return (where.empty() ? std::string("the sequence") : where) +
             " is empty (ids are separated by ',', sequences by ';')";
    }
    std::vector<int64_t> row;
    std::string_view items = sequences[s];
    bool last = false;
    while (!last) {
      const size_t at = items.find(',');
      last = at == std::string_view::npos;
      const std::string_view item = trimmed(last ? items : items.substr(0, at));
      if (!last) items.remove_prefix(at + 1);
      const std::string place =
          (where.empty() ? "" : where + ", ") + "item " + std::to_string(row.size() + 1);
      if (item.empty()) return place + " is empty (ids are separated by ',', sequences by ';')";
      int64_t v = 0;
      const Parsed p = parse_decimal(item, &v);
      if (p == Parsed::kNotANumber || (p == Parsed::kOk && v < 0)) {
        return shown(item) + " is not a token id (" + range_words(0, INT64_MAX) + ")";
      }
      if (p == Parsed::kTooLarge) {
        return "token id " + shown(item) + " is out of range: " + range_words(0, INT64_MAX);
      }
      row.push_back(v);
    }
    if (!rows->empty() && row.size() != rows->front().size()) {
      return "sequences of different lengths (" + std::to_string(rows->front().size()) + " and " +
             std::to_string(row.size()) + ")";
    }
    rows->push_back(std::move(row));
  }
  return "";
}

CLI::Validator token_ids(bool several) {
  return CLI::Validator(
      [several](std::string& text) -> std::string {
        std::vector<std::vector<int64_t>> rows;
        return parse_token_ids(text, several, &rows);
      },
      several ? "IDS[;IDS...]" : "IDS");
}

}  // namespace cli
}  // namespace metaload
