#include "loader/tp/quant_split.h"

#include <algorithm>
#include <numeric>

#include "base/checked.h"

namespace metaload {
namespace {

// 0 when the lcm does not fit (no slice can fall on it then).
int64_t lcm64(int64_t a, int64_t b) {
  return mul_or_none(a / std::gcd(a, b), b).value_or(0);
}

}  // namespace

bool is_row_parallel(const std::string& module) {
  const size_t dot = module.find_last_of('.');
  const std::string leaf = dot == std::string::npos ? module : module.substr(dot + 1);
  static const char* kRow[] = {"o_proj",        "down_proj", "c_proj", "out_proj",
                               "dense_4h_to_h", "fc2",       "w2",     "wo"};
  for (const char* r : kRow) {
    if (leaf == r) return true;
  }
  return false;
}

int64_t tp_unit(const QuantConfig& cfg, const QuantModule& m, int dim, std::string* boundary) {
  auto say = [&](std::string text, int64_t unit) {
    if (boundary) *boundary = std::move(text);
    return unit;
  };
  const auto n = [](int64_t v) { return std::to_string(v); };
  // Values per whole number of int32 words (8 for 4 bits; 32 for 3 bits).
  const int64_t pack = 32 / std::gcd<int64_t>(32, cfg.bits);
  switch (cfg.kind) {
    case QuantKind::kBnb4: {
      // The packed weight and absmax are flat over [out, in]: a slice must cover whole blocks.
      const int64_t bs = m.block > 0 ? m.block : cfg.blocksize;
      if (dim == 0) {
        const int64_t rows = bs / std::gcd<int64_t>(bs, std::max<int64_t>(m.in, 1));
        return say("the " + n(bs) + "-element absmax blocks of the flattened weight (" + n(rows) +
                       " rows of " + n(m.in) + ")",
                   rows);
      }
      if (m.in % bs != 0 && m.out > 1) {
        return say("the " + n(bs) + "-element absmax blocks: rows of " + n(m.in) +
                       " elements do not start on blocks (split the output dim instead)",
                   0);
      }
      return say("the " + n(bs) + "-element absmax blocks", bs);
    }
    case QuantKind::kBnb8:
      return say("whole features", 1);
    case QuantKind::kGptq:
    case QuantKind::kAwq:
    case QuantKind::kCtPacked: {
      const bool packed_in = cfg.kind != QuantKind::kAwq;
      if (dim == 1) {
        const int64_t g = cfg.group_size > 0 ? cfg.group_size : 1;
        std::string text = cfg.group_size > 0 ? "the groups of " + n(cfg.group_size) : "";
        if (!packed_in) return say(text.empty() ? "whole features" : text, g);
        text += (text.empty() ? "the " : " and the ") + n(pack) + "-value int32 packs";
        return say(text, lcm64(g, pack));
      }
      if (cfg.kind == QuantKind::kCtPacked && !cfg.zero_point) return say("whole features", 1);
      return say("the " + n(pack) + "-value int32 packs of " +
                     (cfg.kind == QuantKind::kAwq ? "qweight and qzeros" : "the zero points"),
                 pack);
    }
    case QuantKind::kFp8Block: {
      const int64_t b = dim == 0 ? cfg.block_rows : cfg.block_cols;
      return say("the " + n(b) + "-wide scale blocks", b);
    }
    case QuantKind::kCtNvfp4:
      if (dim == 0) return say("whole features", 1);
      return say("the groups of " + n(cfg.group_size), cfg.group_size);
  }
  return say("whole features", 1);
}

bool is_replicated_in_tp(const std::string& module) {
  const size_t dot = module.find_last_of('.');
  const std::string leaf = dot == std::string::npos ? module : module.substr(dot + 1);
  return leaf == "q_a_proj" || leaf == "kv_a_proj_with_mqa";
}

bool tp_sliceable(const QuantConfig& cfg, const QuantModule& m, int64_t d, std::string* why) {
  if (is_replicated_in_tp(m.name)) return true;
  const bool row = is_row_parallel(m.name);
  const int64_t dim = row ? m.in : m.out;
  const char* dim_name = row ? "input" : "output";
  auto no = [&](const std::string& boundary) {
    if (why) {
      *why = m.name + ": its " + dim_name + " dim " + std::to_string(dim) + " split " +
             std::to_string(d) + " ways does not fall on " + boundary;
    }
    return false;
  };
  if (d <= 0 || dim % d != 0) return no("whole features");
  std::string boundary;
  const int64_t unit = tp_unit(cfg, m, row ? 1 : 0, &boundary);
  if (unit <= 0 || (dim / d) % unit != 0) return no(boundary);
  return true;
}

std::optional<int64_t> quant_max_tp_size(const QuantLayout& layout, std::optional<int64_t> base,
                                         std::string* limited_by) {
  if (limited_by) limited_by->clear();
  if (!base) return std::nullopt;
  for (int64_t d = *base; d >= 1; --d) {
    if (*base % d != 0) continue;
    bool ok = true;
    for (const auto& m : layout.modules) {
      std::string why;
      if (!tp_sliceable(layout.config, m, d, &why)) {
        if (limited_by && limited_by->empty()) *limited_by = why;
        ok = false;
        break;
      }
    }
    if (ok) return d > 1 ? std::optional<int64_t>(d) : std::nullopt;
  }
  return std::nullopt;
}

}  // namespace metaload
