#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "test_util.h"

namespace sluice {
namespace {

using testing::TempDir;

// A safetensors file from a literal header and `data_bytes` bytes of data.
std::string file_bytes(const std::string& header, size_t data_bytes, uint64_t claimed_len = 0) {
  uint64_t len = claimed_len ? claimed_len : header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  out += header;
  out.append(data_bytes, '\x01');
  return out;
}

TEST(Safetensors, RoundTripsThroughWriter) {
  TempDir dir;
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {f32_to_bf16(0.5f), f32_to_bf16(-2.0f)};
  {
    SafetensorsWriter w(
        dir / "x.safetensors",
        {{"a", DType::F32, {2, 3}}, {"b", DType::BF16, {2}}, {"empty", DType::F32, {0, 4}}},
        {{"format", "pt"}});
    w.write(a.data(), a.size() * 4);
    w.write(b.data(), b.size() * 2);
    w.finish();
  }
  SafetensorsFile f = SafetensorsFile::open(dir / "x.safetensors");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  Tensor ta = f.tensors().at("a").view();
  EXPECT_EQ(ta.shape, (Shape{2, 3}));
  EXPECT_EQ(ta.as<float>()[5], 6.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta.data) % 8, 0u) << "data section must stay aligned";
  Tensor tb = f.tensors().at("b").view();
  EXPECT_EQ(bf16_to_f32(tb.as<uint16_t>()[1]), -2.0f);
  EXPECT_EQ(f.tensors().at("empty").nbytes, 0u);
}

TEST(Safetensors, WriterRejectsWrongByteCount) {
  TempDir dir;
  SafetensorsWriter w(dir / "x.safetensors", {{"a", DType::F32, {2}}});
  float one = 1;
  w.write(&one, 4);
  EXPECT_ERROR_MENTIONS(w.finish(), "4 of 8 declared bytes");
}

struct BadFile {
  const char* what;
  std::string bytes;
  std::vector<const char*> mentions;
};

class SafetensorsBadInput : public ::testing::TestWithParam<BadFile> {};

TEST_P(SafetensorsBadInput, GivesAClearError) {
  TempDir dir;
  auto path = dir / "bad.safetensors";
  testing::write_file(path, GetParam().bytes);
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "no error for " << GetParam().what;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
    for (const char* part : GetParam().mentions)
      EXPECT_NE(msg.find(part), std::string::npos) << msg << " lacks " << part;
  }
}

const std::string kGood = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsBadInput,
    ::testing::Values(
        BadFile{"truncated", std::string(5, '\0'), {"truncated"}},
        BadFile{"header longer than file", file_bytes(kGood, 8, 1000), {"header length 1000"}},
        BadFile{"header not json", file_bytes("{not json", 0), {"not a JSON object"}},
        BadFile{"data cut short", file_bytes(kGood, 4), {"'w'", "past the end"}},
        BadFile{"unknown dtype",
                file_bytes(R"({"w":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})", 2),
                {"'w'", "unknown dtype 'F8_E9'"}},
        BadFile{"size disagrees with shape",
                file_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                {"'w'", "hold 8 bytes", "needs 12"}},
        BadFile{"overlapping tensors",
                file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           12),
                {"'a'", "'b'", "overlap"}},
        BadFile{"offsets reversed",
                file_bytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
                {"'w'", "end before they begin"}},
        BadFile{"negative shape",
                file_bytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                {"'w'", "shape"}},
        BadFile{"missing offsets",
                file_bytes(R"({"w":{"dtype":"F32","shape":[2]}})", 8),
                {"'w'", "data_offsets"}},
        BadFile{"tensor not an object", file_bytes(R"({"w":3})", 0), {"'w'", "object"}}),
    [](const auto& param_info) {
      std::string name = param_info.param.what;
      for (char& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name;
    });

TEST(Checkpoint, ReadsAShardedIndex) {
  TempDir dir;
  float one = 1, two = 2;
  for (auto [file, name, value] :
       {std::tuple{"s1.safetensors", "x", &one}, {"s2.safetensors", "y", &two}}) {
    SafetensorsWriter w(dir / file, {{name, DType::F32, {1}}});
    w.write(value, 4);
    w.finish();
  }
  testing::write_file(
      dir / "model.safetensors.index.json",
      R"({"metadata":{},"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})");
  Checkpoint c = Checkpoint::open(dir.path());
  ASSERT_NE(c.find("y"), nullptr);
  EXPECT_EQ(c.find("y")->view().as<float>()[0], 2.0f);
  EXPECT_EQ(c.files().size(), 2u);
}

TEST(Checkpoint, IndexNamingAMissingTensorFails) {
  TempDir dir;
  SafetensorsWriter w(dir / "s1.safetensors", {{"x", DType::F32, {0}}});
  w.finish();
  testing::write_file(dir / "model.safetensors.index.json",
                      R"({"weight_map":{"x":"s1.safetensors","z":"s1.safetensors"}})");
  EXPECT_ERROR_MENTIONS(Checkpoint::open(dir.path()), "s1.safetensors", "'z'");
}

TEST(Checkpoint, FolderWithoutWeightsFails) {
  TempDir dir;
  EXPECT_ERROR_MENTIONS(Checkpoint::open(dir.path()), "no model.safetensors");
}

}  // namespace
}  // namespace sluice
