// Matrix transposition: DBRX's w2 stores each expert's down projection transposed, which loading
// and the disk tier's pool turn into the kernels' [n, k].
#pragma once

#include <cstddef>
#include <cstdint>

namespace sluice::cpu {

// dst [cols, rows] = the transpose of src [rows, cols], elements of `element_bytes` bytes (1, 2,
// 4 or 8; else an error), tile by tile so both sides move in cache lines; 2-byte elements in 8 × 8
// blocks of SSE2 unpacks (x86-64's baseline, no dispatch). A DBRX w2 of 10752 × 6144 bf16 on the
// development VM, one thread: 3.3-3.9 GB/s, against 0.9-1.1 GB/s element by element in tiles of 32.
void transpose_matrix(const void* src, void* dst, int64_t rows, int64_t cols, size_t element_bytes);
// The definition, element by element: the tests' reference.
void transpose_matrix_reference(const void* src, void* dst, int64_t rows, int64_t cols,
                                size_t element_bytes);

}  // namespace sluice::cpu
