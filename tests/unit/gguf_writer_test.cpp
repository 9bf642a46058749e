// The GGUF writer (io/gguf_writer.h) and llama.cpp's reference quantisers (io/gguf_quantize.h):
// a file written tensor by tensor is the image built in memory; a tensor that produces another
// byte count than its info says, or a path that cannot be written, is a clear error; Q8_0 and
// Q4_0 blocks dequantise to within their format's rounding of the values, over awkward lengths.
#include "io/gguf_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <random>

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "io/gguf_quantize.h"
#include "test_util.h"

namespace sluice {
namespace {

using testing::TempDir;

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A tensor streamed in three pieces, beside one given whole.
GgufWriter streamed_file() {
  GgufWriter w;
  w.add("general.architecture", GgufType::kString, "llama");
  w.add_tensor("whole.weight", uint32_t(GgmlType::F32), {3}, std::vector<uint8_t>(12, 7));
  w.add_tensor("pieces.weight", uint32_t(GgmlType::F32), {5, 2}, 40,
               [](const GgufWriter::Sink& sink) {
                 const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
                 sink(x.data(), 12);
                 sink(x.data() + 3, 20);
                 sink(x.data() + 8, 8);
               });
  return w;
}

TEST(GgufWriter, AFileWrittenInPiecesIsTheImageAndReadsBack) {
  TempDir dir;
  const GgufWriter w = streamed_file();
  w.write(dir.path() / "m.gguf");
  EXPECT_EQ(read_all(dir.path() / "m.gguf"), w.image());
  const GgufFile g = GgufFile::open(dir.path() / "m.gguf");
  const GgufTensorInfo* t = g.find_tensor("pieces.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape(), (Shape{2, 5}));
  const float* x = reinterpret_cast<const float*>(t->data());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(x[i], float(i + 1));
}

TEST(GgufWriter, ATensorOfAnotherByteCountIsAnErrorNamingIt) {
  TempDir dir;
  GgufWriter w;
  w.add_tensor("short.weight", uint32_t(GgmlType::F32), {4}, 16,
               [](const GgufWriter::Sink& sink) { sink("abcdefgh", 8); });
  EXPECT_ERROR_MENTIONS(w.write(dir.path() / "m.gguf"), "'short.weight'", "8 bytes", "16");
}

TEST(GgufWriter, APathThatCannotBeWrittenIsNamed) {
  TempDir dir;
  EXPECT_ERROR_MENTIONS(streamed_file().write(dir.path() / "no" / "m.gguf"), "no/m.gguf",
                        "cannot write");
}

// Every value within the format's rounding: half a step for Q8_0's round(); Q4_0 truncates
// x / d + 8.5 and clamps at 15, so up to a whole step at the end of the range away from the
// value of largest magnitude.
TEST(GgufQuantize, BlocksDequantiseToWithinTheirStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t n : {32, 64, 96, 32 * 37}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng) * (rng() % 4 == 0 ? 100.f : 0.01f);
    for (int j = 0; j < 32 && n > 32; ++j) x[32 + size_t(j)] = 0;  // a block of zeros: d = 0
    for (const bool q8 : {true, false}) {
      SCOPED_TRACE(fmt::format("n {} {}", n, q8 ? "Q8_0" : "Q4_0"));
      const std::vector<uint8_t> q = q8 ? quantize_q8_0(x.data(), n) : quantize_q4_0(x.data(), n);
      ASSERT_EQ(q.size(), size_t(n / 32) * (q8 ? 34 : 18));
      std::vector<float> y(x.size());
      ASSERT_TRUE(
          dequantize(uint32_t(q8 ? GgmlType::Q8_0 : GgmlType::Q4_0), q.data(), y.data(), n));
      for (int64_t b = 0; b < n; b += 32) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[size_t(b + j)]));
        const float step = q8 ? amax / 127 : amax / 8;
        // The scale is stored in f16: allow its rounding (2^-11 relative) over the range.
        const float bound = (q8 ? 0.5f : 1.f) * step + amax * 1e-3f;
        for (int j = 0; j < 32; ++j)
          ASSERT_LE(std::fabs(y[size_t(b + j)] - x[size_t(b + j)]), bound) << "value " << b + j;
      }
    }
  }
}

}  // namespace
}  // namespace sluice
