// Output helpers shared by the subcommands.
#include <cstdio>
#include <iostream>

#include "tools/cli/command.h"

namespace metaload {
namespace cli {

std::string with_commas(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string gib_and_bytes(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return std::string(buf) + " (" + with_commas(bytes) + " bytes)";
}

void print_rows(const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t width = 0;
  for (const auto& r : rows) width = std::max(width, r.first.size());
  for (const auto& [k, v] : rows)
    std::cout << k << std::string(width - k.size() + 2, ' ') << v << "\n";
}

}  // namespace cli
}  // namespace metaload
