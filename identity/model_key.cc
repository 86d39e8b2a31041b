#include "identity/model_key.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "base/text.h"
#include "loader/errors.h"
#include "loader/format/json_util.h"
#include "identity/registry.h"

namespace metaload {
namespace {

bool is_dotted_name(std::string_view s) {
  if (s.empty()) return false;
  bool start = true;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '.') {
      if (start) return false;
      start = true;
    } else if (std::isalpha(u) || c == '_' || (!start && std::isdigit(u))) {
      start = false;
    } else {
      return false;
    }
  }
  return !start;
}

// nlohmann holds no integer past 64 bits (it reads one as a double, 2**64 + 1 as
// 18446744073709552000.0), but Python's json keeps every int exact: such an integer is held as its
// decimal digits in a binary value of this subtype (JSON text never makes a binary value).
constexpr std::uint64_t kBigIntSubtype = 0x6d6c;  // "ml"

using Json = nlohmann::ordered_json;

// Builds a value from JSON text as Python's json.loads does: objects keep their key order (the
// text was checked for duplicate keys first) and an integer of any size stays exact.
class KeyJsonBuilder {
 public:
  Json root;

  bool null() { return put(Json()); }
  bool boolean(bool v) { return put(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return put(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return put(Json(v)); }
  bool number_float(Json::number_float_t v, const std::string& text) {
    if (text.find_first_of(".eE") != std::string::npos) return put(Json(v));
    return put(Json::binary(std::vector<std::uint8_t>(text.begin(), text.end()), kBigIntSubtype));
  }
  bool string(std::string& v) { return put(Json(std::move(v))); }
  bool binary(Json::binary_t& v) { return put(Json::binary(v)); }
  bool start_object(std::size_t) { return open(Json::object()); }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    throw ModelKeyError(std::string("not valid JSON: ") + e.what());
  }

 private:
  // Where `v` went. A container's address stays valid while it is open: its parent takes no other
  // value until it is closed.
  Json* place(Json v) {
    if (open_.empty()) {
      root = std::move(v);
      return &root;
    }
    Json& top = *open_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    Json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  bool put(Json v) {
    place(std::move(v));
    return true;
  }
  bool open(Json v) {
    open_.push_back(place(std::move(v)));
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  std::vector<Json*> open_;
  std::string key_;
};

// `v` as Python's repr(float), which json.dumps writes: the shortest digits that read back as v
// (std::to_chars gives the same ones), positional for decimal exponents -4 <= e < 16 ("0.0001",
// "100.0", "-0.0"), else "1e+16", "1.5e-05". Python writes inf and nan as Infinity and NaN, which
// are no JSON: refused.
void append_py_float(std::string& out, double v) {
  if (!std::isfinite(v))
    throw ModelKeyError(
        "a number outside the double range (" + std::string(std::isnan(v) ? "NaN" : "infinite") +
        ") cannot be written in a model key: JSON has no such number (rule json-number-range)");
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view t(buf, static_cast<size_t>(r.ptr - buf));  // "-1.2345e+06"
  if (t.front() == '-') {
    out += '-';
    t.remove_prefix(1);
  }
  const size_t e = t.find('e');
  std::string digits(1, t[0]);
  if (e > 1) digits.append(t.substr(2, e - 2));
  const int exp = std::atoi(std::string(t.substr(e + 1)).c_str());
  if (exp >= 16 || exp < -4) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exp < 0 ? "e-" : "e+";
    if (std::abs(exp) < 10) out += '0';
    out += std::to_string(std::abs(exp));
  } else if (exp < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (digits.size() <= static_cast<size_t>(exp) + 1) {
    out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(exp + 1);
  }
}

// A scalar as json.dumps writes it.
void dump_py_scalar(std::string& out, const Json& v) {
  switch (v.type()) {
    case Json::value_t::string:
      append_json_string(out, v.get_ref<const std::string&>(), true);
      break;
    case Json::value_t::number_float:
      append_py_float(out, v.get<double>());
      break;
    case Json::value_t::binary:
      if (v.get_binary().has_subtype() && v.get_binary().subtype() == kBigIntSubtype) {
        out.append(v.get_binary().begin(), v.get_binary().end());
        break;
      }
      throw ModelKeyError("a binary value cannot be written in a model key (JSON has none)");
    default:
      out += v.dump();  // null, booleans and 64-bit integers print as Python prints them
  }
}

// `depth`: the nesting level v's container would open. Deeper than any key can be read back
// (kMaxJsonDepth) is refused, which also bounds this recursion.
void dump_py(std::string& out, const nlohmann::ordered_json& v, int depth) {
  if (v.is_structured() && depth > kMaxJsonDepth) {
    throw ModelKeyError(json_too_deep_detail() + " (rule json-too-deep)");
  }
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, it.key(), true);
        out += ": ";
        dump_py(out, it.value(), depth + 1);
      }
      out += '}';
      break;
    }
    case nlohmann::ordered_json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        dump_py(out, v[i], depth + 1);
      }
      out += ']';
      break;
    }
    default:
      dump_py_scalar(out, v);
  }
}

constexpr size_t kMaxRepoPart = 96;  // the Hub's limit on a repo name

bool repo_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.';
}

// The rule the key policy's message ends with, as FormatError's do.
std::string policy_message(std::string_view repo_id, std::string_view key, const RepoIdProblem& p) {
  std::string m =
      key.empty() ? std::string("repo_id ") : "model key " + quote_str(key) + ": repo_id ";
  return m + quote_str(repo_id) +
         " is not a Hugging Face Hub repo id (NAME or ORG/NAME): " + p.detail +
         "; keys name Hub repos, resolved in the local hub cache; to accept keys naming local "
         "paths, opt in with allow_local_paths (--allow-local-paths) (rule " +
         p.rule + ")";
}

}  // namespace

std::optional<RepoIdProblem> hub_repo_id_problem(std::string_view id) {
  if (id.empty()) return RepoIdProblem{"repo-id-empty", "it is empty"};
  if (id.front() == '/') return RepoIdProblem{"repo-id-absolute-path", "it is an absolute path"};
  if (id.find("..") != std::string_view::npos)
    return RepoIdProblem{"repo-id-parent-dir",
                         "\"..\" is not allowed (a path would climb out of its directory)"};
  const size_t slash = id.find('/');
  if (slash != std::string_view::npos && id.find('/', slash + 1) != std::string_view::npos)
    return RepoIdProblem{"repo-id-parts", "it has more than one '/'"};
  if (slash == id.size() - 1) return RepoIdProblem{"repo-id-parts", "the name after '/' is empty"};
  for (size_t i = 0; i < id.size(); ++i) {
    const char c = id[i];
    if (repo_char(c) || c == '/') continue;
    const std::string what = static_cast<unsigned char>(c) >= 0x80
                                 ? "a non-ASCII character"
                                 : "character " + quote_str(std::string_view(&id[i], 1));
    return RepoIdProblem{"repo-id-character",
                         what + " at byte " + std::to_string(i) +
                             " is not allowed (ASCII letters, digits, '-', '_' and '.' are)"};
  }
  if (id.find("--") != std::string_view::npos)
    return RepoIdProblem{
        "repo-id-double-dash",
        "\"--\" is not allowed (the hub cache uses it as the '/' of folder names)"};
  for (std::string_view part :
       {slash == std::string_view::npos ? id : id.substr(0, slash),
        slash == std::string_view::npos ? std::string_view() : id.substr(slash + 1)}) {
    if (part.empty()) continue;
    if (part.front() == '-' || part.front() == '.' || part.back() == '-' || part.back() == '.')
      return RepoIdProblem{"repo-id-edge", quote_str(part) + " begins or ends with '-' or '.'"};
    if (part.size() > kMaxRepoPart)
      return RepoIdProblem{"repo-id-length", quote_str(part, 40) + " is " +
                                                 std::to_string(part.size()) +
                                                 " characters long (at most 96)"};
  }
  if (id.size() >= 4 && id.substr(id.size() - 4) == ".git")
    return RepoIdProblem{"repo-id-git-suffix", "it ends with \".git\""};
  return std::nullopt;
}

void check_key_repo_id(std::string_view repo_id, const KeyOptions& options, std::string_view key) {
  std::optional<RepoIdProblem> p;
  if (options.allow_local_paths) {
    if (repo_id.empty()) {
      p = RepoIdProblem{"repo-id-empty", "it is empty"};
    } else if (repo_id.find('\0') != std::string_view::npos) {
      p = RepoIdProblem{"repo-id-nul", "it holds a NUL byte, which no path can"};
    }
    if (p) {
      throw RepoIdError(
          (key.empty() ? std::string("repo_id ") : "model key " + quote_str(key) + ": repo_id ") +
              quote_str(repo_id) + " cannot name a local path: " + p->detail + " (rule " + p->rule +
              ")",
          std::string(repo_id), p->rule);
    }
    return;
  }
  p = hub_repo_id_problem(repo_id);
  if (p) throw RepoIdError(policy_message(repo_id, key, *p), std::string(repo_id), p->rule);
}

nlohmann::ordered_json parse_key_json(std::string_view text, const std::string& what) {
  // Syntax, depth and duplicate keys as every JSON metaload reads (FormatError), then the value.
  parse_json_strict(text, what);
  KeyJsonBuilder b;
  Json::sax_parse(text.begin(), text.end(), &b);
  return std::move(b.root);
}

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump_py(out, value, 1);
  return out;
}

std::string to_model_key(const ModelKey& key, const KeyOptions& options) {
  if (!is_dotted_name(key.class_path)) {
    throw ModelKeyError("class path " + quote_text(key.class_path) +
                        " is not a dotted Python name (e.g. " + kTransformersModel + ")");
  }
  if (key.repo_id.empty()) throw ModelKeyError("empty repo_id");
  if (!valid_utf8(key.repo_id)) throw ModelKeyError("repo_id is not valid UTF-8");
  check_key_repo_id(key.repo_id, options);
  if (key.revision && !valid_utf8(*key.revision))
    throw ModelKeyError("revision is not valid UTF-8");
  std::string out = key.class_path + ":{\"repo_id\": ";
  append_json_string(out, key.repo_id, true);
  out += ", \"revision\": ";
  if (key.revision) {
    append_json_string(out, *key.revision, true);
  } else {
    out += "null";
  }
  for (const auto& [k, v] : key.extra) {
    if (k == "repo_id" || k == "revision")
      throw ModelKeyError("extra field " + quote_text(k) + " duplicates a key field");
    if (!valid_utf8(k)) throw ModelKeyError("extra field name is not valid UTF-8");
    out += ", ";
    append_json_string(out, k, true);
    out += ": ";
    try {
      dump_py(out, v, 2);  // the key's object is the first level
    } catch (const nlohmann::json::exception& e) {
      throw ModelKeyError("extra field " + quote_text(k) + " cannot be written: " + e.what());
    } catch (const ModelKeyError& e) {
      throw ModelKeyError("extra field " + quote_text(k) + " cannot be written: " + e.message());
    }
  }
  out += "}";
  return out;
}

ModelKey from_model_key(std::string_view key, const KeyOptions& options) {
  size_t colon = key.find(':');
  if (colon == std::string_view::npos) {
    throw ModelKeyError("model key " + quote_str(key) +
                        " has no ':' between the class path and the JSON");
  }
  ModelKey k;
  k.class_path = std::string(key.substr(0, colon));
  std::string_view json = key.substr(colon + 1);
  if (!is_dotted_name(k.class_path)) {
    throw ModelKeyError("model key class path " + quote_str(k.class_path) +
                        " is not a dotted Python name");
  }
  if (!find_model_class(k.class_path)) {
    std::string known;
    for (const auto& c : known_model_classes()) known += (known.empty() ? "" : ", ") + c;
    throw ModelKeyError("unknown class " + quote_str(k.class_path) +
                        " in model key; known: " + known);
  }
  nlohmann::ordered_json j;
  try {
    j = parse_key_json(json, "model key");  // rejects duplicate keys, which ordered_json keeps
  } catch (const FormatError& e) {
    throw ModelKeyError("bad JSON after the class path of model key " + quote_str(key) + ": " +
                        e.detail() + " (rule " + e.rule() + ")");
  }
  if (!j.is_object()) throw ModelKeyError("model key JSON is not an object: " + quote_str(json));
  auto repo = j.find("repo_id");
  if (repo == j.end()) throw ModelKeyError("model key JSON has no \"repo_id\": " + quote_str(json));
  if (!repo->is_string() || repo->get_ref<const std::string&>().empty()) {
    throw ModelKeyError("model key \"repo_id\" is not a non-empty string: " + quote_str(json));
  }
  k.repo_id = repo->get<std::string>();
  auto rev = j.find("revision");
  if (rev != j.end() && !rev->is_null()) {
    if (!rev->is_string())
      throw ModelKeyError("model key \"revision\" is neither a string nor null: " +
                          quote_str(json));
    k.revision = rev->get<std::string>();
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "repo_id" && it.key() != "revision") k.extra.emplace_back(it.key(), it.value());
  }
  // Last: a RepoIdError means the key is otherwise well formed.
  check_key_repo_id(k.repo_id, options, key);
  return k;
}

}  // namespace metaload
