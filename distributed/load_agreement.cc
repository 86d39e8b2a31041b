// The handshake of a load across ranks (handshake.h): what every rank must agree on before any
// reads, checked on every rank from the same all-gathered hellos, so all fail alike.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "base/text.h"
#include "distributed/handshake.h"

namespace metaload {
namespace {

using nlohmann::json;

// A hello's value as the messages show it: numbers and text as they are, null as None.
std::string shown(const json& v) {
  if (v.is_null()) return "None";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// "rank 0: <v0>, rank 1: <v1>, ..." of field `key`.
std::string each(const std::vector<json>& peers, const char* key) {
  std::string out;
  for (size_t r = 0; r < peers.size(); ++r) {
    out += fmt::format("{}rank {}: {}", r ? ", " : "", r, shown(peers[r].value(key, json())));
  }
  return out;
}

bool all_equal(const std::vector<json>& peers, const char* key) {
  for (const json& p : peers) {
    if (p.value(key, json()) != peers[0].value(key, json())) return false;
  }
  return true;
}

void tp_problems(const std::vector<json>& peers, int group_size, std::vector<std::string>& out) {
  if (!all_equal(peers, "tp_size")) {
    out.push_back(fmt::format("tp_size differs ({})", each(peers, "tp_size")));
    return;
  }
  const int64_t size = peers[0].value("tp_size", int64_t{0});
  std::vector<int64_t> ranks;
  for (const json& p : peers) ranks.push_back(p.value("tp_rank", int64_t{-1}));
  std::sort(ranks.begin(), ranks.end());
  bool once_each = static_cast<int64_t>(ranks.size()) == size;
  for (size_t i = 0; i < ranks.size() && once_each; ++i) {
    once_each = ranks[i] == static_cast<int64_t>(i);
  }
  if (size != 1 && size != group_size) {
    out.push_back(
        fmt::format("tp_size {} is neither 1 nor the process group's size {}", size, group_size));
  } else if (size > 1 && !once_each) {
    out.push_back(
        fmt::format("tp_rank must be 0..{}, once each ({})", size - 1, each(peers, "tp_rank")));
  } else if (size == 1 && ranks.back() != 0) {
    out.push_back(fmt::format("tp_size 1 has only tp_rank 0 ({})", each(peers, "tp_rank")));
  }
}

void source_problems(const std::vector<json>& peers, int group_size,
                     std::vector<std::string>& out) {
  if (!all_equal(peers, "source_rank")) {
    out.push_back(fmt::format("source_rank differs ({})", each(peers, "source_rank")));
    return;
  }
  const json s = peers[0].value("source_rank", json());
  if (!s.is_null() &&
      !(s.is_number_integer() && s.get<int64_t>() >= 0 && s.get<int64_t>() < group_size)) {
    out.push_back(
        fmt::format("source_rank {} is not a rank of the group (0..{})", shown(s), group_size - 1));
  }
}

}  // namespace

std::vector<std::string> load_handshake_problems(const std::vector<std::string>& hellos,
                                                 int group_size) {
  std::vector<json> peers;
  for (size_t r = 0; r < hellos.size(); ++r) {
    json j = json::parse(hellos[r], nullptr, false);
    if (!j.is_object() || !j.contains("tp_size") || !j["tp_size"].is_number_integer()) {
      return {fmt::format("rank {} sent {}, not a metaload load's handshake", r,
                          quote_text(hellos[r]))};
    }
    peers.push_back(std::move(j));
  }
  std::vector<std::string> out;
  if (peers.empty()) return out;
  if (!all_equal(peers, "protocol")) {
    out.push_back(fmt::format("metaload versions differ (protocol {})", each(peers, "protocol")));
    return out;
  }
  tp_problems(peers, group_size, out);
  std::string bad;
  for (size_t r = 0; r < peers.size(); ++r) {
    if (peers[r].value("buffer_bytes", int64_t{0}) < 0) {
      bad +=
          fmt::format("{}rank {}: {}", bad.empty() ? "" : ", ", r, peers[r]["buffer_bytes"].dump());
    }
  }
  if (!bad.empty()) {
    out.push_back(
        fmt::format("buffer_bytes must be 0 (the default, {} MiB) or a positive number "
                    "of bytes ({})",
                    kDefaultLoadBufferBytes >> 20, bad));
  }
  for (const char* key : {"dequantize", "tp_plan"}) {
    if (!all_equal(peers, key))
      out.push_back(fmt::format("{} differs ({})", key, each(peers, key)));
  }
  source_problems(peers, group_size, out);
  return out;
}

std::vector<std::string> load_handshake(Collectives& group, const std::string& hello) {
  json mine = json::parse(hello, nullptr, false);
  if (!mine.is_object()) {
    throw DistributedError(
        fmt::format("a load's hello must be a JSON object, got {}", quote_text(hello)));
  }
  mine["protocol"] = kLoadProtocol;
  std::vector<std::string> hellos;
  try {
    hellos = group.all_gather_text(mine.dump());
  } catch (const DistributedError& e) {
    throw lost_contact(group, "the handshake", e.message());
  }
  const std::vector<std::string> problems = load_handshake_problems(hellos, group.size());
  if (problems.empty()) return hellos;
  std::string message = "the ranks of the process group disagree, nothing was loaded: ";
  for (size_t i = 0; i < problems.size(); ++i) message += (i ? "; " : "") + problems[i];
  throw DistributedError(message);
}

DistributedError lost_contact(const Collectives& group, const std::string& step,
                              const std::string& why) {
  return DistributedError(fmt::format(
      "rank {} of {}: {} failed, so nothing was loaded (the weights are as before; the process "
      "group must be made again): {}",
      group.rank(), group.size(), step, why));
}

}  // namespace metaload
