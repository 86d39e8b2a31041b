// JSON helpers shared by the format layer and the identity code. Torch-free.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/text.h"

namespace metaload {

// Parses JSON text strictly: syntax errors (rule "invalid-json") and duplicate object keys at any
// depth (rule "duplicate-key", naming the key and its parent) raise FormatError(file, "", rule),
// since nlohmann would silently keep the last duplicate.
// `on_duplicate(parent_key, key)` may throw a more specific error first ("" is the top level).
nlohmann::json parse_json_strict(
    std::string_view text, const std::string& file,
    const std::function<void(const std::string&, const std::string&)>& on_duplicate = {});

// Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF). On failure, *bad_offset
// receives the offset of the first invalid byte.
bool valid_utf8(std::string_view s, size_t* bad_offset = nullptr);

// `s` quoted for an error message: quote_text (base/text.h), the one rule for every message.
inline std::string quote_str(std::string_view s, size_t max_len = kQuoteMaxChars) {
  return quote_text(s, '"', max_len);
}

}  // namespace metaload
