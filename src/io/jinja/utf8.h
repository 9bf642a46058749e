// Python's str is a sequence of code points while ours are UTF-8 bytes; these helpers give
// indexing, slicing, length and whitespace the code-point meaning templates expect
// (`tool_call.id|length != 9`, `out[:-1]`, `content.strip()`).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::jinja::utf8 {

// Byte offsets where each code point starts, plus a final entry equal to s.size(). Invalid bytes
// count as one code point each, so every byte string has a well-defined length.
std::vector<size_t> code_point_offsets(std::string_view s);

size_t length(std::string_view s);

// The code point starting at byte `pos`, and its byte length in `size`.
uint32_t decode(std::string_view s, size_t pos, size_t* size);

void append(std::string& out, uint32_t code_point);

// str.isspace() for one code point (Unicode White_Space plus the ASCII separators Python counts).
bool is_python_space(uint32_t cp);

}  // namespace sluice::jinja::utf8
