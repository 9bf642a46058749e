#include "core/units.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>

#include "core/error.h"

namespace sluice {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f} M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.2f} K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

size_t parse_bytes(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  std::string number = text.substr(0, i), unit = text.substr(i);
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) throw std::invalid_argument(number);
  } catch (const std::exception&) {
    fail("{}: expected a size such as 24GiB, 512MiB or 4096, got '{}'", what, text);
  }
  struct Unit {
    const char* name;
    double scale;
  };
  const Unit units[] = {{"", 1},        {"B", 1},           {"K", 1024},      {"KB", 1e3},
                        {"KiB", 1024},  {"M", 1 << 20},     {"MB", 1e6},      {"MiB", 1 << 20},
                        {"G", 1 << 30}, {"GB", 1e9},        {"GiB", 1 << 30}, {"T", 1ull << 40},
                        {"TB", 1e12},   {"TiB", 1ull << 40}};
  for (const auto& u : units)
    if (unit == u.name) return size_t(std::llround(value * u.scale));
  fail("{}: unknown size unit '{}' in '{}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", what, unit,
       text);
}

}  // namespace sluice
