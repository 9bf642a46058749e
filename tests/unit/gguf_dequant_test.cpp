// The GGUF dequantisers against blocks built here by hand, byte by byte from the block layouts
// of ggml-common.h, whose values are known: each expected value is written from the format's
// definition (scale · integer - min), not from the code under test.
#include "io/gguf_dequant.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "io/gguf.h"

namespace sluice {
namespace {

void put_half(std::vector<uint8_t>& b, size_t at, float x) {
  const uint16_t h = f32_to_f16(x);
  std::memcpy(b.data() + at, &h, 2);
}

// Two blocks of each format (the second with other values) so that the block stride is checked.
constexpr int kBlocks = 2;

TEST(GgufDequant, Q8_0) {
  std::vector<uint8_t> b(34 * kBlocks);
  std::vector<float> want;
  for (int k = 0; k < kBlocks; ++k) {
    const float d = k == 0 ? 0.5f : -0.125f;
    put_half(b, 34 * size_t(k), d);
    for (int j = 0; j < 32; ++j) {
      const int q = k == 0 ? j - 16 : (j % 2 ? 127 : -128);
      b[34 * size_t(k) + 2 + size_t(j)] = uint8_t(int8_t(q));
      want.push_back(d * float(q));
    }
  }
  std::vector<float> got(want.size());
  dequantize_q8_0(b.data(), got.data(), int64_t(got.size()));
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], -8.f);
  EXPECT_EQ(got[33], -0.125f * 127);
}

TEST(GgufDequant, Q4_0) {
  std::vector<uint8_t> b(18 * kBlocks);
  std::vector<float> want(32 * kBlocks);
  for (int k = 0; k < kBlocks; ++k) {
    const float d = k == 0 ? 0.25f : 3.f;
    put_half(b, 18 * size_t(k), d);
    for (int j = 0; j < 16; ++j) {
      const int lo = (j + k) % 16, hi = 15 - j;
      b[18 * size_t(k) + 2 + size_t(j)] = uint8_t(lo | (hi << 4));
      want[32 * size_t(k) + size_t(j)] = d * float(lo - 8);       // value j: the low nibble
      want[32 * size_t(k) + 16 + size_t(j)] = d * float(hi - 8);  // value j + 16: the high one
    }
  }
  std::vector<float> got(want.size());
  dequantize_q4_0(b.data(), got.data(), int64_t(got.size()));
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], -2.f);    // 0.25 · (0 - 8)
  EXPECT_EQ(got[16], 1.75f);  // 0.25 · (15 - 8)
}

// The 12 bytes holding eight 6-bit scales and mins, as ggml packs them: j < 4 in the low 6 bits
// of bytes j (scale) and j + 4 (min); j >= 4 in the low/high nibble of byte j + 4, with the top
// two bits in the top bits of byte j - 4 (scale) and byte j (min).
std::vector<uint8_t> pack_scales(const int sc[8], const int mn[8]) {
  std::vector<uint8_t> q(12, 0);
  for (int j = 0; j < 4; ++j) {
    q[size_t(j)] = uint8_t(sc[j]);
    q[size_t(j) + 4] = uint8_t(mn[j]);
  }
  for (int j = 4; j < 8; ++j) {
    q[size_t(j) + 4] = uint8_t((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
    q[size_t(j) - 4] |= uint8_t((sc[j] >> 4) << 6);
    q[size_t(j)] |= uint8_t((mn[j] >> 4) << 6);
  }
  return q;
}

// A K-quant super-block's 8 sub-blocks of 32 with scales and mins over the full 6 bits.
struct SubBlocks {
  int sc[8], mn[8];
  explicit SubBlocks(int k) {
    for (int s = 0; s < 8; ++s) {
      sc[s] = (8 * s + 5 + k) % 64;  // 5 .. 61: s >= 4 uses the top bits
      mn[s] = 63 - 7 * s - k;
    }
  }
};

TEST(GgufDequant, Q4_K) {
  std::vector<uint8_t> b(144 * kBlocks, 0);
  std::vector<float> want(256 * kBlocks);
  for (int k = 0; k < kBlocks; ++k) {
    uint8_t* blk = b.data() + 144 * k;
    const float d = k == 0 ? 0.5f : 0.0625f, dmin = k == 0 ? 0.25f : 2.f;
    const SubBlocks s(k);
    put_half(b, 144 * size_t(k), d);
    put_half(b, 144 * size_t(k) + 2, dmin);
    const auto packed = pack_scales(s.sc, s.mn);
    std::memcpy(blk + 4, packed.data(), 12);
    // Value v of sub-block t (t = 2g or 2g + 1): the low (t even) or high nibble of byte
    // 32g + v of the 128 quant bytes.
    for (int t = 0; t < 8; ++t)
      for (int v = 0; v < 32; ++v) {
        const int q = (v * 7 + t + k) % 16;
        uint8_t& byte = blk[16 + 32 * (t / 2) + v];
        byte |= uint8_t(t % 2 ? q << 4 : q);
        want[256 * size_t(k) + 32 * size_t(t) + size_t(v)] =
            d * float(s.sc[t]) * float(q) - dmin * float(s.mn[t]);
      }
  }
  std::vector<float> got(want.size());
  dequantize_q4_k(b.data(), got.data(), int64_t(got.size()));
  EXPECT_EQ(got, want);
}

TEST(GgufDequant, Q5_K) {
  std::vector<uint8_t> b(176 * kBlocks, 0);
  std::vector<float> want(256 * kBlocks);
  for (int k = 0; k < kBlocks; ++k) {
    uint8_t* blk = b.data() + 176 * k;
    const float d = k == 0 ? 0.5f : 0.03125f, dmin = k == 0 ? 0.125f : 1.f;
    const SubBlocks s(k + 3);
    put_half(b, 176 * size_t(k), d);
    put_half(b, 176 * size_t(k) + 2, dmin);
    const auto packed = pack_scales(s.sc, s.mn);
    std::memcpy(blk + 4, packed.data(), 12);
    // Value v of sub-block t: low 4 bits as in Q4_K (quant bytes at 48), the fifth in bit t of
    // qh[v] (the 32 bytes at 16).
    for (int t = 0; t < 8; ++t)
      for (int v = 0; v < 32; ++v) {
        const int q = (v * 11 + t * 3 + k) % 32;
        blk[48 + 32 * (t / 2) + v] |= uint8_t(t % 2 ? (q & 0xF) << 4 : q & 0xF);
        blk[16 + v] |= uint8_t((q >> 4) << t);
        want[256 * size_t(k) + 32 * size_t(t) + size_t(v)] =
            d * float(s.sc[t]) * float(q) - dmin * float(s.mn[t]);
      }
  }
  std::vector<float> got(want.size());
  dequantize_q5_k(b.data(), got.data(), int64_t(got.size()));
  EXPECT_EQ(got, want);
}

TEST(GgufDequant, Q6_K) {
  std::vector<uint8_t> b(210 * kBlocks, 0);
  std::vector<float> want(256 * kBlocks);
  for (int k = 0; k < kBlocks; ++k) {
    uint8_t* blk = b.data() + 210 * k;
    const float d = k == 0 ? 0.125f : 0.5f;
    int8_t scales[16];
    for (int i = 0; i < 16; ++i) scales[i] = int8_t((i * 7 + k) % 41 - 20);
    std::memcpy(blk + 192, scales, 16);
    put_half(b, 210 * size_t(k) + 208, d);
    // Value x (0..255): half h = x / 128; in it quarter r (32 values each) and l = x % 32. Its
    // low 4 bits are the low (r < 2) or high nibble of ql[64h + l + 32·(r % 2)], its top 2 bits
    // bits 2r..2r+1 of qh[32h + l]; its scale scales[8h + l / 16 + 2r]; x = d·scale·(q - 32).
    for (int x = 0; x < 256; ++x) {
      const int h = x / 128, r = (x % 128) / 32, l = x % 32;
      const int q = (x * 5 + 3 + k) % 64;
      blk[64 * h + l + 32 * (r % 2)] |= uint8_t(r < 2 ? q & 0xF : (q & 0xF) << 4);
      blk[128 + 32 * h + l] |= uint8_t((q >> 4) << (2 * r));
      want[256 * size_t(k) + size_t(x)] = d * float(scales[8 * h + l / 16 + 2 * r]) * float(q - 32);
    }
  }
  std::vector<float> got(want.size());
  dequantize_q6_k(b.data(), got.data(), int64_t(got.size()));
  EXPECT_EQ(got, want);
}

TEST(GgufDequant, DispatchByTypeAndRefusesOthers) {
  std::vector<uint8_t> b(34, 0);
  put_half(b, 0, 2.f);
  b[2] = 3;
  std::vector<float> got(32, -1.f);
  EXPECT_TRUE(dequantize(uint32_t(GgmlType::Q8_0), b.data(), got.data(), 32));
  EXPECT_EQ(got[0], 6.f);
  EXPECT_EQ(got[1], 0.f);
  EXPECT_FALSE(dequantize(uint32_t(GgmlType::Q4_1), b.data(), got.data(), 32));
  EXPECT_FALSE(dequantize(uint32_t(GgmlType::F16), b.data(), got.data(), 32));
}

}  // namespace
}  // namespace sluice
