// The GGUF reader (io/gguf.h): metadata of every type, tensor infos and alignment, split files,
// and bad input (truncated files, offsets past the end, unknown types, bad headers), each a clear
// error naming the file and the field; and a fuzz test of the header parser.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "test_util.h"

namespace sluice {
namespace {

using testing::TempDir;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<uint8_t> floats_bytes(std::vector<float> v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A small file: metadata of several types and two tensors.
GgufWriter small_file() {
  GgufWriter w;
  w.add("general.architecture", GgufType::kString, "llama");
  w.add("test.u8", GgufType::kU8, 200);
  w.add("test.i16", GgufType::kI16, -300);
  w.add("test.u64", GgufType::kU64, uint64_t(1) << 40);
  w.add("test.f32", GgufType::kF32, 0.5);
  w.add("test.f64", GgufType::kF64, -2.25);
  w.add("test.flag", GgufType::kBool, true);
  w.add("test.list", GgufType::kArray, nlohmann::json::array({1, 2, 3}), GgufType::kI32);
  w.add("test.words", GgufType::kArray, nlohmann::json::array({"a", "bc"}), GgufType::kString);
  w.add_tensor("a.weight", uint32_t(GgmlType::F32), {3, 2}, floats_bytes({1, 2, 3, 4, 5, 6}));
  w.add_tensor("b.weight", uint32_t(GgmlType::F32), {5}, floats_bytes({7, 8, 9, 10, 11}));
  return w;
}

GgufFile parse(const std::string& image, const std::string& where = "mem.gguf") {
  return GgufFile::parse_image(reinterpret_cast<const std::byte*>(image.data()), image.size(),
                               where);
}

TEST(GgufFile, ReadsMetadataOfEveryTypeAndTensorInfos) {
  for (size_t alignment : {32, 64, 8}) {
    GgufWriter w = small_file();
    if (alignment != 32) w.add("general.alignment", GgufType::kU32, alignment);
    const std::string image = w.image(alignment);
    const GgufFile g = parse(image);
    EXPECT_EQ(g.version(), 3u);
    EXPECT_EQ(g.required_string("general.architecture"), "llama");
    EXPECT_EQ(g.integer("test.u8"), 200);
    EXPECT_EQ(g.integer("test.i16"), -300);
    EXPECT_EQ(g.integer("test.u64"), int64_t(1) << 40);
    EXPECT_EQ(g.number("test.f32"), 0.5);
    EXPECT_EQ(g.number("test.f64"), -2.25);
    EXPECT_EQ(g.boolean("test.flag"), true);
    EXPECT_EQ(g.find("test.list")->element, GgufType::kI32);
    EXPECT_EQ(g.find("test.list")->value, nlohmann::json::array({1, 2, 3}));
    EXPECT_EQ(g.find("test.words")->value, nlohmann::json::array({"a", "bc"}));
    EXPECT_FALSE(g.integer("test.absent").has_value());
    ASSERT_EQ(g.tensors().size(), 2u);
    const GgufTensorInfo& a = *g.find_tensor("a.weight");
    EXPECT_EQ(a.dims, (Shape{3, 2}));
    EXPECT_EQ(a.shape(), (Shape{2, 3}));  // row-major: 2 rows of 3
    EXPECT_EQ(a.nbytes, 24u);
    const GgufTensorInfo& b = *g.find_tensor("b.weight");
    // b starts at the next multiple of the alignment after a's 24 bytes.
    EXPECT_EQ(b.offset - a.offset, (24 + alignment - 1) / alignment * alignment);
    EXPECT_EQ(a.offset % alignment, 0u);
    float got[5];
    std::memcpy(got, b.data(), 20);
    EXPECT_EQ(got[0], 7.f);
    EXPECT_EQ(got[4], 11.f);
  }
}

TEST(GgufFile, TypedReadsNameTheKey) {
  const std::string image = small_file().image();
  const GgufFile g = parse(image);
  std::string msg = error_of([&] { g.integer("test.f32"); });
  EXPECT_NE(msg.find("mem.gguf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'test.f32'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected an integer"), std::string::npos) << msg;
  msg = error_of([&] { g.required_integer("llama.block_count"); });
  EXPECT_NE(msg.find("'llama.block_count' is missing"), std::string::npos) << msg;
}

TEST(GgufFile, EveryTruncationIsAClearError) {
  const std::string image = small_file().image();
  // Every cut inside the header, metadata and infos; then cuts inside the data.
  for (size_t n = 0; n < image.size(); ++n) {
    const std::string cut = image.substr(0, n);
    const std::string msg = error_of([&] { parse(cut, "cut.gguf"); });
    if (n >= image.size() - 12) {
      // The last tensor's padding may be cut without losing data.
      if (msg == "(no error)") continue;
    }
    EXPECT_NE(msg.find("cut.gguf"), std::string::npos) << n << ": " << msg;
    const bool early = msg.find("ends early") != std::string::npos;
    const bool past = msg.find("past the end") != std::string::npos;
    EXPECT_TRUE(early || past) << n << ": " << msg;
    if (past) {
      EXPECT_NE(msg.find("field 'offset'"), std::string::npos) << msg;
    }
  }
}

TEST(GgufFile, TensorOffsetPastTheEnd) {
  GgufWriter w = small_file();
  std::string image = w.image();
  const size_t offset_field = w.tensor_type_field_offset(1) + 4;
  const uint64_t far = 1 << 20;
  std::memcpy(image.data() + offset_field, &far, 8);
  const std::string msg = error_of([&] { parse(image, "far.gguf"); });
  EXPECT_NE(msg.find("far.gguf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 'b.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("field 'offset'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("past the end"), std::string::npos) << msg;
}

TEST(GgufFile, UnknownTensorType) {
  for (uint32_t type : {23u, 99u}) {
    GgufWriter w = small_file();
    w.retype_tensor("b.weight", type);
    const std::string msg = error_of([&] { parse(w.image(), "type.gguf"); });
    EXPECT_NE(msg.find("type.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor 'b.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("field 'type'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(type == 23 ? "IQ4_XS" : "99 (unknown)"), std::string::npos) << msg;
  }
}

TEST(GgufFile, BadHeaders) {
  std::string image = small_file().image();
  std::string bad = image;
  bad[0] = 'X';
  EXPECT_NE(error_of([&] { parse(bad); }).find("field 'magic'"), std::string::npos);
  bad = small_file().image(32, 7);
  EXPECT_NE(error_of([&] { parse(bad); }).find("field 'version': expected 2 or 3, got 7"),
            std::string::npos);
  GgufWriter w = small_file();
  w.add("general.alignment", GgufType::kU32, 24);
  EXPECT_NE(error_of([&] { parse(w.image()); }).find("'general.alignment'"), std::string::npos);
  w = small_file();
  w.redim_tensor("a.weight", {3, 0});
  EXPECT_NE(error_of([&] { parse(w.image()); }).find("field 'dims'"), std::string::npos);
  w = small_file();
  w.add("test.u8", GgufType::kU8, 1);  // the key again
  EXPECT_NE(error_of([&] { parse(w.image()); }).find("appears twice"), std::string::npos);
}

// Random byte changes and cuts of a valid file: the parser either reads it or throws
// sluice::Error; nothing else escapes, nothing crashes (run under the sanitizer build too).
TEST(GgufFileFuzz, MutatedHeadersParseOrFailCleanly) {
  const std::string image = small_file().image();
  std::mt19937_64 rng(14);
  int parsed = 0, refused = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string m = image;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % m.size();
      switch (rng() % 3) {
        case 0:
          m[at] = char(rng());
          break;
        case 1:
          m[at] = char(m[at] ^ (1 << (rng() % 8)));
          break;
        default:
          m[at] = char(0xFF);
      }
    }
    if (rng() % 4 == 0) m.resize(rng() % m.size());
    try {
      parse(m);
      ++parsed;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(refused, 0);
}

TEST(GgufFile, SplitFilesLoadAsOne) {
  TempDir dir;
  GgufWriter a, b;
  a.add("general.architecture", GgufType::kString, "llama");
  a.add("split.count", GgufType::kU16, 2);
  a.add_tensor("a.weight", uint32_t(GgmlType::F32), {2}, floats_bytes({1, 2}));
  b.add("split.count", GgufType::kU16, 2);
  b.add_tensor("b.weight", uint32_t(GgmlType::F32), {2}, floats_bytes({3, 4}));
  a.write(dir / "m-00001-of-00002.gguf");
  b.write(dir / "m-00002-of-00002.gguf");
  const GgufFile g = GgufFile::open(dir / "m-00001-of-00002.gguf");
  EXPECT_EQ(g.tensors().size(), 2u);
  EXPECT_EQ(g.parts().size(), 2u);
  float x;
  std::memcpy(&x, g.find_tensor("b.weight")->data(), 4);
  EXPECT_EQ(x, 3.f);
  // The second part alone is refused with the name of the first.
  std::string msg = error_of([&] { GgufFile::open(dir / "m-00002-of-00002.gguf"); });
  EXPECT_NE(msg.find("m-00001-of-00002.gguf"), std::string::npos) << msg;
  // A missing part is named.
  std::filesystem::remove(dir / "m-00002-of-00002.gguf");
  msg = error_of([&] { GgufFile::open(dir / "m-00001-of-00002.gguf"); });
  EXPECT_NE(msg.find("m-00002-of-00002.gguf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

}  // namespace
}  // namespace sluice
