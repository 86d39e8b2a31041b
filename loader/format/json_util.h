// JSON helpers shared by the format layer and the identity code. Torch-free.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/text.h"

namespace metaload {

// The deepest nesting of arrays and objects accepted in any JSON metaload reads: config.json,
// index files, safetensors headers, model keys, JSON arguments. nlohmann parses iteratively, but
// copying, comparing, writing and walking a value recurse once per level, so a few hundred KB of
// brackets would overflow the stack; real files nest a few levels. Deeper JSON is refused with
// FormatError rule "json-too-deep" (json_too_deep below), before any value is built.
inline constexpr int kMaxJsonDepth = 128;

// FormatError(file, "", "json-too-deep"): JSON nested more than kMaxJsonDepth levels; and its
// detail, for parsers that raise it themselves.
[[noreturn]] void throw_json_too_deep(const std::string& file);
std::string json_too_deep_detail();

// Parses JSON text strictly: syntax errors (rule "invalid-json"), nesting deeper than
// kMaxJsonDepth ("json-too-deep") and duplicate object keys at any depth (rule "duplicate-key",
// naming the key and its parent) raise FormatError(file, "", rule), since nlohmann would silently
// keep the last duplicate.
// `on_duplicate(parent_key, key)` may throw a more specific error first ("" is the top level).
nlohmann::json parse_json_strict(
    std::string_view text, const std::string& file,
    const std::function<void(const std::string&, const std::string&)>& on_duplicate = {});

// Parses JSON text as Python's json module does (a duplicate key keeps its last value), with the
// same depth limit: FormatError rules "invalid-json" and "json-too-deep".
nlohmann::json parse_json(std::string_view text, const std::string& file);

// Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF). On failure, *bad_offset
// receives the offset of the first invalid byte.
bool valid_utf8(std::string_view s, size_t* bad_offset = nullptr);

// Appends `s` (valid UTF-8) as a JSON string literal: the one JSON string escaper. '"', '\\' and
// control characters are escaped as nlohmann's dump() does (safetensors headers); ensure_ascii
// also escapes DEL and every non-ASCII character as \uXXXX (astral ones as a surrogate pair), as
// Python's json.dumps does by default (model keys).
void append_json_string(std::string& out, std::string_view s, bool ensure_ascii);
std::string json_string(std::string_view s, bool ensure_ascii = false);

// `s` quoted for an error message: quote_text (base/text.h), the one rule for every message.
inline std::string quote_str(std::string_view s, size_t max_len = kQuoteMaxChars) {
  return quote_text(s, '"', max_len);
}

}  // namespace metaload
