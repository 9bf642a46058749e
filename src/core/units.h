// Human-readable sizes and rates for messages and reports, and parsing of sizes like "24GiB".
#pragma once

#include <cstddef>
#include <string>

namespace sluice {

std::string human_bytes(double bytes);  // "11.3 GiB"
std::string human_count(double n);      // "46.7 B", "12.9 M"
// Parses "24GiB", "512MiB", "1.5GB", "4096" (bytes); fails naming `what` on bad input.
size_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace sluice
