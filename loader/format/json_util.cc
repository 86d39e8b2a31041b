#include "loader/format/json_util.h"

#include <cstdio>
#include <set>
#include <vector>

#include "loader/errors.h"

namespace metaload {
namespace {

// Thrown from the parse callback to abort the parse at the first duplicate key.
struct DuplicateKey {
  std::string key;
  std::string parent;
};

}  // namespace

std::string json_too_deep_detail() {
  return "arrays and objects nest more than " + std::to_string(kMaxJsonDepth) +
         " levels deep; metaload reads JSON nested up to " + std::to_string(kMaxJsonDepth) +
         " levels (kMaxJsonDepth)";
}

[[noreturn]] void throw_json_too_deep(const std::string& file) {
  throw FormatError(file, "", "json-too-deep", json_too_deep_detail());
}

namespace {

// nlohmann stops at a NUL byte as if the input ended there; raw NULs are never valid JSON.
void refuse_nul(std::string_view text, const std::string& file) {
  if (size_t nul = text.find('\0'); nul != std::string_view::npos) {
    throw FormatError(file, "", "invalid-json",
                      "NUL byte at offset " + std::to_string(nul) + " (not valid JSON)");
  }
}

// JSON text is UTF-8 (RFC 8259); nlohmann's own message would quote the raw byte it stopped at.
void refuse_not_utf8(std::string_view text, const std::string& file) {
  size_t bad = 0;
  if (!valid_utf8(text, &bad)) {
    std::string byte;
    text_detail::hex_escape(byte, "0x", static_cast<unsigned char>(text[bad]), 2);
    throw FormatError(file, "", "json-not-utf8",
                      "byte " + byte + " at offset " + std::to_string(bad) +
                          " is not UTF-8 (JSON text must be UTF-8)");
  }
}

// `depth` of a container start event is that of its parent (0 at the top level).
void check_depth(int depth, nlohmann::json::parse_event_t event, const std::string& file) {
  using E = nlohmann::json::parse_event_t;
  if ((event == E::object_start || event == E::array_start) && depth + 1 > kMaxJsonDepth) {
    throw_json_too_deep(file);
  }
}

}  // namespace

nlohmann::json parse_json_strict(
    std::string_view text, const std::string& file,
    const std::function<void(const std::string&, const std::string&)>& on_duplicate) {
  // One key set per open object; a key stack names the parent in messages.
  std::vector<std::set<std::string>> keys;
  std::vector<std::string> path;  // key under which each open object sits
  std::string last_key;
  auto cb = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    check_depth(depth, event, file);
    switch (event) {
      case E::object_start:
        keys.emplace_back();
        path.push_back(last_key);
        break;
      case E::object_end:
        keys.pop_back();
        path.pop_back();
        break;
      case E::key: {
        const std::string& k = parsed.get_ref<const std::string&>();
        if (!keys.back().insert(k).second) throw DuplicateKey{k, path.back()};
        last_key = k;
        break;
      }
      case E::array_start:
        // Objects inside arrays have no key of their own.
        last_key = "[]";
        break;
      default:
        break;
    }
    return true;
  };
  refuse_nul(text, file);
  refuse_not_utf8(text, file);
  try {
    return nlohmann::json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true);
  } catch (const DuplicateKey& d) {
    if (on_duplicate) on_duplicate(d.parent, d.key);
    std::string where = d.parent.empty() ? "the top-level object" : "object " + quote_str(d.parent);
    throw FormatError(file, "", "duplicate-key",
                      "key " + quote_str(d.key) + " appears more than once in " + where);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(file, "", "invalid-json", std::string("not valid JSON: ") + e.what());
  }
}

nlohmann::json parse_json(std::string_view text, const std::string& file) {
  auto cb = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    check_depth(depth, event, file);
    return true;
  };
  refuse_nul(text, file);
  refuse_not_utf8(text, file);
  try {
    return nlohmann::json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(file, "", "invalid-json", std::string("not valid JSON: ") + e.what());
  }
}

bool valid_utf8(std::string_view s, size_t* bad_offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  auto fail = [&](size_t at) {
    if (bad_offset) *bad_offset = at;
    return false;
  };
  while (i < n) {
    unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return fail(i);
    }
    if (i + len > n) return fail(i);
    for (size_t k = 1; k < len; ++k) {
      unsigned cc = p[i + k];
      if ((cc & 0xC0) != 0x80) return fail(i);
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return fail(i);
    }
    i += len;
  }
  return true;
}

namespace {

void append_u16(std::string& out, unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\u%04x", v);
  out += buf;
}

}  // namespace

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    if (c >= 0x80 && !ensure_ascii) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          // Python's ensure_ascii escapes everything outside ' '..'~', DEL included.
          if (c < 0x20 || (c == 0x7F && ensure_ascii)) {
            append_u16(out, c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // Decode one UTF-8 sequence (validated by the caller).
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    unsigned cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < len && i + k < n; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
    i += len;
    if (cp >= 0x10000) {  // astral: a UTF-16 surrogate pair, as Python writes it
      cp -= 0x10000;
      append_u16(out, 0xD800 + (cp >> 10));
      append_u16(out, 0xDC00 + (cp & 0x3FF));
    } else {
      append_u16(out, cp);
    }
  }
  out += '"';
}

std::string json_string(std::string_view s, bool ensure_ascii) {
  std::string out;
  append_json_string(out, s, ensure_ascii);
  return out;
}

}  // namespace metaload
