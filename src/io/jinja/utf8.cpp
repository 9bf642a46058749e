#include "io/jinja/utf8.h"

namespace sluice::jinja::utf8 {

uint32_t decode(std::string_view s, size_t pos, size_t* size) {
  auto byte = [&](size_t i) { return uint8_t(s[i]); };
  uint8_t b0 = byte(pos);
  size_t need = b0 < 0x80           ? 1
                : (b0 >> 5) == 0x6  ? 2
                : (b0 >> 4) == 0xe  ? 3
                : (b0 >> 3) == 0x1e ? 4
                                    : 0;
  if (need <= 1 || pos + need > s.size()) {
    *size = 1;
    return b0;
  }
  uint32_t cp = b0 & (0x7f >> need);
  for (size_t i = 1; i < need; ++i) {
    uint8_t b = byte(pos + i);
    if ((b & 0xc0) != 0x80) {
      *size = 1;
      return b0;
    }
    cp = (cp << 6) | (b & 0x3f);
  }
  *size = need;
  return cp;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  size_t pos = 0;
  while (pos < s.size()) {
    offsets.push_back(pos);
    size_t size = 1;
    decode(s, pos, &size);
    pos += size;
  }
  offsets.push_back(s.size());
  return offsets;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (size_t pos = 0, size = 1; pos < s.size(); pos += size, ++n) decode(s, pos, &size);
  return n;
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

bool is_python_space(uint32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20)) return true;
  switch (cp) {
    case 0x85:
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

}  // namespace sluice::jinja::utf8
