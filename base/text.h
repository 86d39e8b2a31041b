// User-supplied text (tensor names, paths, repo ids, model keys) in messages: one escaping rule and
// one cap, used by every message that quotes such text, so that no name can cut a message short
// (a NUL ends the C string torch and Python read), forge extra lines, or make it megabytes long.
// Torch-free, header-only.
//
//   quote_text("w\0x")          -> "\"w\\x00x\""
//   quote_text("caf\xc3\xa9")    -> "\"caf\\u00e9\""  (non-ASCII: its code point, never the glyph)
//   quote_text("a\xff")         -> "\"a\\xff\""      (a byte that is not UTF-8)
//   quote_text(10 MB name)      -> "\"aaaa...aaa...\" (10485760 bytes)"  (kQuoteMaxChars kept)
//   capped_list(100000 x)   -> "a, b, ... (20 of them), ... and 99980 more"
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace metaload {

inline constexpr size_t kQuoteMaxChars = 200;  // characters kept of one quoted value
inline constexpr size_t kListMaxItems = 20;    // items kept of one list in a message
// A path is cut in the middle, never at the end: its file name is the part a reader needs, and
// deep build sandboxes and caches make honest paths longer than kQuoteMaxChars.
inline constexpr size_t kPathHeadChars = 120;  // characters kept of a long path's start
inline constexpr size_t kPathTailChars = 400;  // characters kept of a long path's end

namespace text_detail {

// Length of the valid UTF-8 sequence at s[i] (no overlong forms, surrogates or code points past
// U+10FFFF), or 0 when the byte there does not start one.
inline size_t utf8_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = byte(i);
  if (c < 0x80) return 1;
  size_t len;
  unsigned cp;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return len;
}

// The code point of the valid UTF-8 sequence of `len` bytes (utf8_length) at s[i].
inline unsigned code_point(std::string_view s, size_t i, size_t len) {
  static const unsigned lead_mask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  unsigned cp = static_cast<unsigned char>(s[i]) & lead_mask[len];
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

inline void hex_escape(std::string& out, const char* prefix, unsigned value, int digits) {
  static const char* hex = "0123456789abcdef";
  out += prefix;
  for (int d = digits - 1; d >= 0; --d) out += hex[(value >> (4 * d)) & 15];
}

// Appends the escaped form of at most max_chars characters of s (and `quote`, when not 0, as
// "\" + quote); true when s was cut.
inline bool escape_into(std::string& out, std::string_view s, size_t max_chars, char quote) {
  size_t chars = 0, i = 0;
  while (i < s.size()) {
    if (chars++ == max_chars) return true;
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = utf8_length(s, i);
    if (len == 0) {  // a byte that is not UTF-8: shown, never passed through
      hex_escape(out, "\\x", c, 2);
      ++i;
      continue;
    }
    if (len == 1) {
      if (c == '\\') {
        out += "\\\\";
      } else if (quote != 0 && c == static_cast<unsigned char>(quote)) {
        out += '\\';
        out += quote;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c < 0x20 || c == 0x7F) {
        hex_escape(out, "\\x", c, 2);
      } else {
        out += static_cast<char>(c);
      }
    } else {
      // Every other character as its code point: names that differ only in Unicode
      // normalisation ("\u00e9" and "e\u0301"), in look-alikes ("K" and the Kelvin sign
      // "\u212a") or in invisible characters (zero-width joiners, bidi overrides, C1 controls)
      // must never print alike.
      const unsigned cp = code_point(s, i, len);
      if (cp < 0x10000) {
        hex_escape(out, "\\u", cp, 4);
      } else {
        hex_escape(out, "\\U", cp, 8);
      }
    }
    i += len;
  }
  return false;
}

}  // namespace text_detail

// `s` for a message, without quotes: control characters, backslashes, non-ASCII characters and
// bytes that are not UTF-8 escaped ("\n", "\x00", "\\", "\u0301", "\U0001f600", "\xff"), cut after
// max_chars characters with "..." and the full size: "abc... (10485760 bytes)".
inline std::string escape_text(std::string_view s, size_t max_chars = kQuoteMaxChars) {
  std::string out;
  if (text_detail::escape_into(out, s, max_chars, /*quote=*/0)) {
    out += "... (" + std::to_string(s.size()) + " bytes)";
  }
  return out;
}

// `s` with each byte that is not UTF-8 shown as "\xNN" and everything else kept as it is: every
// error message goes through this (base/error.h), since torch hands what() to Python as a str,
// and one raw byte there would lose the whole message (RuntimeError('')).
inline std::string utf8_safe(std::string_view s) {
  std::string out;
  size_t done = 0;  // s[0, done) is copied
  for (size_t i = 0; i < s.size();) {
    const size_t len = text_detail::utf8_length(s, i);
    if (len != 0) {
      i += len;
      continue;
    }
    if (out.empty()) out.reserve(s.size() + 8);
    out.append(s.substr(done, i - done));
    text_detail::hex_escape(out, "\\x", static_cast<unsigned char>(s[i]), 2);
    done = ++i;
  }
  if (done == 0) return std::string(s);
  out.append(s.substr(done));
  return out;
}

// A file path for a message, escaped as escape_text does; one longer than
// kPathHeadChars + kPathTailChars loses its middle, never its file name:
// "/root/.cache/...x/model.safetensors (5000 bytes)".
inline std::string escape_path(std::string_view s, char quote = 0) {
  if (s.size() <= kPathHeadChars + kPathTailChars) {
    std::string whole;
    if (!text_detail::escape_into(whole, s, kPathHeadChars + kPathTailChars, quote)) return whole;
  }
  std::string out;
  text_detail::escape_into(out, s.substr(0, kPathHeadChars), kPathHeadChars, quote);
  size_t tail = s.size() - kPathTailChars;  // bytes, then moved to a UTF-8 boundary
  while (tail < s.size() && (static_cast<unsigned char>(s[tail]) & 0xC0) == 0x80) ++tail;
  out += "...";
  text_detail::escape_into(out, s.substr(tail), kPathTailChars, quote);
  out += " (" + std::to_string(s.size()) + " bytes)";
  return out;
}

// escape_path(s) in quotes, that quote inside escaped: "\"/a/b\"", "\"/root/...x/model.json (5000
// bytes)\"" for a path cut in its middle.
inline std::string quote_path(std::string_view s, char quote = '"') {
  return std::string(1, quote) + escape_path(s, quote) + quote;
}

// escape_text(s) in quotes (double by default, JSON-like; '\'' where a message uses those), with
// that quote inside escaped too: "\"abc\"", "'abc'", "\"abc...\" (10485760 bytes)".
inline std::string quote_text(std::string_view s, char quote = '"',
                              size_t max_chars = kQuoteMaxChars) {
  std::string out(1, quote);
  const bool cut = text_detail::escape_into(out, s, max_chars, quote);
  if (cut) out += "...";
  out += quote;
  if (cut) out += " (" + std::to_string(s.size()) + " bytes)";
  return out;
}

// The words that close a list cut at max_items: "... and 80 more" (empty when nothing was cut).
inline std::string and_more(size_t total, size_t max_items = kListMaxItems) {
  return total > max_items ? "... and " + std::to_string(total - max_items) + " more"
                           : std::string();
}

// Items (already escaped or quoted by the caller) joined by `sep`, at most max_items of them,
// then "... and N more".
inline std::string capped_list(const std::vector<std::string>& items, std::string_view sep = ", ",
                               size_t max_items = kListMaxItems) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < max_items; ++i) {
    if (i) out += sep;
    out += items[i];
  }
  if (items.size() > max_items) out += std::string(sep) + and_more(items.size(), max_items);
  return out;
}

// s ends with the given text (C++17's string_view has no ends_with).
inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A shape as torch prints one, "[2, 3]" ("[]" for a scalar): any sequence of integers with
// size() and [] (std::vector<int64_t>, at::IntArrayRef, ...).
template <typename Ints>
std::string shape_str(const Ints& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(static_cast<long long>(shape[i]));
  }
  return out + "]";
}

}  // namespace metaload
