#include "kernels/cpu/transpose.h"

#include <emmintrin.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace sluice::cpu {

namespace {

// Tiles of this many rows and columns keep a tile's source and destination lines in L1 and L2.
constexpr int64_t kTile = 128;

template <typename T>
void transpose_elements(const T* src, T* dst, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                        int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; ++c)
    for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
}

template <typename T>
void transpose_tiles(const T* src, T* dst, int64_t rows, int64_t cols) {
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      transpose_elements(src, dst, rows, cols, r0, std::min(rows, r0 + kTile), c0,
                         std::min(cols, c0 + kTile));
}

// One 8 × 8 block of 16-bit elements: three rounds of unpacks (16-, 32-, then 64-bit lanes).
void transpose_8x8(const uint16_t* s, int64_t ls, uint16_t* d, int64_t ld) {
  __m128i a[8], b[8], c[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * ls));
  for (int i = 0; i < 4; ++i) {
    b[2 * i] = _mm_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
    b[2 * i + 1] = _mm_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 2; ++i) {
      c[4 * h + 2 * i] = _mm_unpacklo_epi32(b[4 * h + i], b[4 * h + i + 2]);
      c[4 * h + 2 * i + 1] = _mm_unpackhi_epi32(b[4 * h + i], b[4 * h + i + 2]);
    }
  for (int i = 0; i < 4; ++i) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * i) * ld),
                     _mm_unpacklo_epi64(c[i], c[i + 4]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * i + 1) * ld),
                     _mm_unpackhi_epi64(c[i], c[i + 4]));
  }
}

void transpose_16bit(const uint16_t* src, uint16_t* dst, int64_t rows, int64_t cols) {
  const int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (int64_t r0 = 0; r0 < rows8; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols8; c0 += kTile) {
      const int64_t r1 = std::min(rows8, r0 + kTile), c1 = std::min(cols8, c0 + kTile);
      for (int64_t r = r0; r < r1; r += 8)
        for (int64_t c = c0; c < c1; c += 8)
          transpose_8x8(src + r * cols + c, cols, dst + c * rows + r, rows);
    }
  // The edges that are not whole blocks: the last rows, then the last columns.
  transpose_elements(src, dst, rows, cols, rows8, rows, 0, cols);
  transpose_elements(src, dst, rows, cols, 0, rows8, cols8, cols);
}

struct Bytes8 {
  std::byte b[8];
};

}  // namespace

void transpose_matrix(const void* src, void* dst, int64_t rows, int64_t cols,
                      size_t element_bytes) {
  switch (element_bytes) {
    case 1:
      return transpose_tiles(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), rows,
                             cols);
    case 2:
      return transpose_16bit(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), rows,
                             cols);
    case 4:
      return transpose_tiles(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), rows,
                             cols);
    case 8:
      return transpose_tiles(static_cast<const Bytes8*>(src), static_cast<Bytes8*>(dst), rows,
                             cols);
    default:
      fail("transpose_matrix: elements of {} bytes (expected 1, 2, 4 or 8)", element_bytes);
  }
}

void transpose_matrix_reference(const void* src, void* dst, int64_t rows, int64_t cols,
                                size_t element_bytes) {
  const auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(d + size_t(c * rows + r) * element_bytes,
                  s + size_t(r * cols + c) * element_bytes, element_bytes);
}

}  // namespace sluice::cpu
