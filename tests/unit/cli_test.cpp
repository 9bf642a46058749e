// End-to-end tests of the sluice command line: outputs, formats, and bad input giving one clear
// error line and a non-zero exit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/cpu/isa.h"
#include "model/presets.h"
#include "model/reference_forward.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "test_util.h"

namespace sluice {
namespace {

using testing::run_command;
using testing::sluice_command;
using testing::TempDir;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = run_command(
        sluice_command("make-model --preset tiny-mixtral --out " + model().string() + " --seed 3"));
    ASSERT_EQ(r.status, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::filesystem::path model() { return dir_->path() / "tiny"; }
  static TempDir* dir_;
};
TempDir* Cli::dir_ = nullptr;

TEST_F(Cli, MakeModelWritesACompleteFolder) {
  for (const char* file : {"config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json", "generation_config.json"})
    EXPECT_TRUE(std::filesystem::exists(model() / file)) << file;
}

TEST_F(Cli, LogitsPrintsOneRowPerPositionMatchingTheReference) {
  auto r =
      run_command(sluice_command("logits --model " + model().string() + " --tokens 1,5,300,7"));
  ASSERT_EQ(r.status, 0) << r.output;
  auto rows = lines_of(r.output);
  ASSERT_EQ(rows.size(), 4u);
  Model m = load_model(model());
  ReferenceForward f(m);
  std::vector<int> tokens = {1, 5, 300, 7};
  std::vector<float> expected = f.forward(tokens);
  for (size_t t = 0; t < rows.size(); ++t) {
    std::istringstream in(rows[t]);
    std::vector<float> values;
    for (float v; in >> v;) values.push_back(v);
    ASSERT_EQ(values.size(), 384u) << "row " << t;
    for (size_t v = 0; v < values.size(); ++v)
      ASSERT_EQ(values[v], expected[t * 384 + v])
          << "row " << t << " column " << v << ": printed values round-trip";
  }
}

TEST_F(Cli, InspectReportsShapesAndCounts) {
  auto r = run_command(sluice_command("inspect --model " + model().string()));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* part : {"MixtralForCausalLM", "8 per layer, top 2", "369.98 K total",
                           "active per token", "BF16", "per decoded token"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << " in\n" << r.output;
  const std::string machine =
      cpu::cpu_model_name() + ", ISA level " + cpu::isa_name(cpu::isa_level());
  EXPECT_NE(r.output.find(machine), std::string::npos) << machine << " in\n" << r.output;
}

// The ceilings follow the level: under SLUICE_ISA=scalar, bench-kernels names the CPU and the
// level, and its instruction peaks are the scalar loops' (bf16 being the fp32 one).
TEST(CliBenchKernels, ScalarLevelPrintsTheLevelTheCpuAndItsInstructionPeaks) {
  auto r = run_command("SLUICE_ISA=scalar " +
                       sluice_command("bench-kernels --skip-gemm --skip-int8 --skip-attention"));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const std::string& part :
       {cpu::cpu_model_name(), std::string("ISA level scalar"), std::string("DRAM read bandwidth"),
        std::string("instruction peaks at scalar"), std::string("scalar fp32 mul+add"),
        std::string("no bf16 instruction at scalar"), std::string("scalar int8 mul+add")})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << " in\n" << r.output;
  for (const char* above : {"vfmadd", "vpmadd", "vpdpbusd", "ymm", "zmm"})
    EXPECT_EQ(r.output.find(above), std::string::npos) << above << " at scalar in\n" << r.output;
}

// Token-for-token equality of the engine and the reference is tested in batch_engine_test; here
// the command line: greedy output is deterministic and both paths continue the prompt.
TEST_F(Cli, GenerateGreedyIsDeterministicOnBothPaths) {
  const std::string base =
      "generate --model " + model().string() + " --prompt 'Hello world' --max-new-tokens 12";
  auto engine = run_command(sluice_command(base), false);
  auto again = run_command(sluice_command(base), false);
  auto reference = run_command(sluice_command(base + " --reference"), false);
  ASSERT_EQ(engine.status, 0) << engine.output;
  ASSERT_EQ(reference.status, 0) << reference.output;
  EXPECT_EQ(engine.output, again.output);
  EXPECT_EQ(engine.output.rfind("Hello world", 0), 0u) << engine.output;
  EXPECT_EQ(reference.output.rfind("Hello world", 0), 0u) << reference.output;
  EXPECT_GT(engine.output.size(), std::string("Hello world\n").size());
}

TEST_F(Cli, GenerateRunsAFileOfPromptsAsOneBatch) {
  TempDir d;
  testing::write_file(d / "prompts.txt", "The quick brown fox\nHello world!\n\nIt is forty two,\n");
  auto r = run_command(sluice_command("generate --model " + model().string() + " --input " +
                                      (d / "prompts.txt").string() + " --max-new-tokens 5"),
                       false);
  ASSERT_EQ(r.status, 0) << r.output;
  auto rows = lines_of(r.output);
  ASSERT_GE(rows.size(), 3u);
  EXPECT_EQ(rows[0].rfind("[1] The quick brown fox", 0), 0u) << r.output;
}

// --token-ids prints each continuation's ids under its text: max-new-tokens of them (or fewer,
// ending at the end-of-text token), each within the vocabulary.
TEST_F(Cli, GenerateTokenIdsPrintsTheIdsOfEachContinuation) {
  TempDir d;
  testing::write_file(d / "prompts.txt", "The quick brown fox\nHello world!\n");
  auto r =
      run_command(sluice_command("generate --model " + model().string() + " --input " +
                                 (d / "prompts.txt").string() + " --max-new-tokens 5 --token-ids"),
                  false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto rows = lines_of(r.output);
  ASSERT_EQ(rows.size(), 4u) << r.output;
  for (size_t i = 1; i < rows.size(); i += 2) {
    ASSERT_EQ(rows[i].rfind("  token ids: ", 0), 0u) << rows[i];
    std::istringstream in(rows[i].substr(std::string("  token ids: ").size()));
    int count = 0;
    for (std::string id; std::getline(in, id, ',');) {
      ++count;
      EXPECT_GE(std::stoi(id), 0) << rows[i];
      EXPECT_LT(std::stoi(id), load_model_config(model()).vocab_size) << rows[i];
    }
    EXPECT_GE(count, 1) << rows[i];
    EXPECT_LE(count, 5) << rows[i];
  }
  auto reference = run_command(sluice_command("generate --model " + model().string() +
                                              " --prompt Hi --reference --token-ids"));
  EXPECT_NE(reference.status, 0);
  EXPECT_NE(reference.output.find("--token-ids is for the batch engine"), std::string::npos)
      << reference.output;
}

// A prompt that can never run (here: more KV blocks than --kv-blocks gives) fails alone: the
// others are printed, then its error, and the exit status is 1.
TEST_F(Cli, GenerateFailsAPromptThatCanNeverRunAloneAndExitsNonZero) {
  TempDir d;
  testing::write_file(d / "prompts.txt",
                      "Hi\none two three four five six seven eight nine ten eleven twelve thirteen "
                      "fourteen fifteen sixteen seventeen eighteen nineteen twenty\n");
  auto r = run_command(sluice_command("generate --model " + model().string() + " --input " +
                                      (d / "prompts.txt").string() +
                                      " --max-new-tokens 4 --kv-blocks 2 --kv-block-size 8"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("[1] Hi"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[2] "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("error: prompt 2 ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("KV-cache blocks of 8 tokens; the largest KV pool has 2 "
                          "(kv_cache_too_small)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("error: 1 of 2 prompts failed"), std::string::npos) << r.output;
}

// The engine runs the planner's policy for the actual prompts unless a field is given; a host
// memory limit too small for the weights fails with what would fit.
TEST_F(Cli, GenerateRunsThePlannersPolicyWithinTheHostMemoryLimit) {
  TempDir d;
  testing::write_file(d / "prompts.txt", "The quick brown fox\nHello world!\nIt is forty two,\n");
  const std::string base = "generate --model " + model().string() + " --input " +
                           (d / "prompts.txt").string() + " --max-new-tokens 4";
  auto planned = run_command(sluice_command(base));
  ASSERT_EQ(planned.status, 0) << planned.output;
  EXPECT_NE(planned.output.find("policy B=3 "), std::string::npos) << planned.output;
  EXPECT_NE(planned.output.find("(planned with the"), std::string::npos) << planned.output;
  auto overridden = run_command(sluice_command(base + " --batch 1 --expert-batch 7"));
  ASSERT_EQ(overridden.status, 0) << overridden.output;
  EXPECT_NE(overridden.output.find("policy B=1 b_a="), std::string::npos) << overridden.output;
  EXPECT_NE(overridden.output.find(" b_e=7 "), std::string::npos) << overridden.output;
  auto starved = run_command(sluice_command(base + " --host-mem 64KiB"));
  EXPECT_EQ(starved.status, 1);
  EXPECT_EQ(lines_of(starved.output).size(), 1u) << starved.output;
  // Refused before loading: not even the disk tier's resident part fits.
  EXPECT_EQ(starved.output.rfind("error: " + model().string() + ": the weights need ", 0), 0u)
      << starved.output;
  EXPECT_NE(starved.output.find("more than the budget of 64.00 KiB (--host-mem); even with the "
                                "routed experts on disk"),
            std::string::npos)
      << starved.output;
  EXPECT_NE(starved.output.find("sluice quantize"), std::string::npos) << starved.output;
}

TEST_F(Cli, SampledGenerationDependsOnTheSeedOnly) {
  const std::string base =
      "generate --model " + model().string() +
      " --prompt 'Hello' --max-new-tokens 10 --temperature 1 --top-p 0.9 --top-k 50";
  auto a = run_command(sluice_command(base + " --seed 1"), false);
  auto b = run_command(sluice_command(base + " --seed 1"), false);
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
}

struct BadModel {
  const char* name;
  std::function<void(const std::filesystem::path&)> damage;
  const char* mention;
};

class CliBadModel : public ::testing::TestWithParam<BadModel> {};

// Each damaged folder gives exactly one line on stderr, starting "error:", naming what is wrong,
// and exit status 1 — never a crash.
TEST_P(CliBadModel, OneClearErrorLineAndExitStatusOne) {
  TempDir d;
  write_random_checkpoint(preset_config("tiny-mixtral"), d.path(), 1);
  GetParam().damage(d.path());
  for (const char* command : {"inspect", "logits"}) {
    std::string args = std::string(command) + " --model " + d.path().string() +
                       (std::string(command) == "logits" ? " --tokens 1,2" : "");
    auto r = run_command(sluice_command(args));
    EXPECT_EQ(r.status, 1) << command << ": " << r.output;
    auto out = lines_of(r.output);
    ASSERT_EQ(out.size(), 1u) << command << ": " << r.output;
    EXPECT_EQ(out[0].rfind("error: ", 0), 0u) << out[0];
    EXPECT_NE(out[0].find(GetParam().mention), std::string::npos) << out[0];
  }
}

void truncate_weights(const std::filesystem::path& d, size_t keep) {
  std::filesystem::resize_file(d / "model.safetensors", keep);
}

void patch_header(const std::filesystem::path& d, const std::string& from, const std::string& to) {
  std::ifstream in(d / "model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  ASSERT_EQ(from.size(), to.size());
  bytes.replace(at, from.size(), to);
  std::ofstream(d / "model.safetensors", std::ios::binary) << bytes;
}

void edit_config(const std::filesystem::path& d, const std::string& from, const std::string& to) {
  std::ifstream in(d / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  std::ofstream(d / "config.json") << text;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CliBadModel,
    ::testing::Values(
        BadModel{"truncated_file", [](auto& d) { truncate_weights(d, 5); }, "truncated"},
        BadModel{"header_longer_than_file", [](auto& d) { truncate_weights(d, 100); },
                 "header length"},
        BadModel{"data_cut_short",
                 [](auto& d) {
                   truncate_weights(d, std::filesystem::file_size(d / "model.safetensors") - 10);
                 },
                 "past the end"},
        BadModel{"unknown_dtype", [](auto& d) { patch_header(d, "\"BF16\"", "\"BX16\""); },
                 "unknown dtype 'BX16'"},
        BadModel{"offsets_disagree_with_shape",
                 [](auto& d) { patch_header(d, "\"data_offsets\":[0,", "\"data_offsets\":[2,"); },
                 "data_offsets [2,"},
        BadModel{"wrong_shape", [](auto& d) { patch_header(d, "[384,64]", "[64,384]"); },
                 "expected shape [384, 64]"},
        BadModel{"missing_tensor",
                 [](auto& d) { patch_header(d, "model.norm.weight", "model.norX.weight"); },
                 "'model.norm.weight' is missing"},
        BadModel{"malformed_config", [](auto& d) { edit_config(d, "{", "{,"); }, "not valid JSON"},
        BadModel{"unsupported_architecture",
                 [](auto& d) { edit_config(d, "MixtralForCausalLM", "MambaForCausalLM"); },
                 "unsupported architecture 'MambaForCausalLM'"},
        BadModel{"no_weights", [](auto& d) { std::filesystem::remove(d / "model.safetensors"); },
                 "no model.safetensors"}),
    [](const auto& param_info) { return std::string(param_info.param.name); });

// export-gguf writes files the engine loads: in BF16 with the folder's logits, bit for bit (the
// Q8_0 and Q4_0 files' logits are checked in gguf_model_test.cpp); a bad --type names the option
// and the choices.
TEST_F(Cli, ExportGgufWritesAFileWithTheFoldersLogits) {
  TempDir d;
  const std::string tokens = " --tokens 1,5,300,7";
  const auto from_folder =
      run_command(sluice_command("logits --model " + model().string() + tokens));
  ASSERT_EQ(from_folder.status, 0) << from_folder.output;
  for (const char* type : {"bf16", "q8_0"}) {
    const std::string file = (d.path() / (std::string(type) + ".gguf")).string();
    auto r = run_command(sluice_command("export-gguf --model " + model().string() + " --out " +
                                        file + " --type " + type));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(std::string("matrices in ") + (type[0] == 'b' ? "BF16" : "Q8_0")),
              std::string::npos)
        << r.output;
    const auto from_file = run_command(sluice_command("logits --model " + file + tokens));
    ASSERT_EQ(from_file.status, 0) << from_file.output;
    auto rows = lines_of(from_file.output);  // after the note that Q8_0 is dequantised at load
    std::erase_if(rows, [](const std::string& l) { return l.starts_with("sluice: "); });
    ASSERT_EQ(rows.size(), 4u) << from_file.output;
    if (type[0] == 'b') {
      EXPECT_EQ(from_file.output, from_folder.output);
    }
  }
  const auto r = run_command(sluice_command("export-gguf --model " + model().string() + " --out " +
                                            (d.path() / "x.gguf").string() + " --type q5_k"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--type: 'q5_k' is not a GGUF weight type; expected f32, bf16, q8_0"),
            std::string::npos)
      << r.output;
}

TEST(CliArguments, BadTokenListNamesTheItem) {
  auto r = run_command(sluice_command("logits --model /nonexistent --tokens 1,x,3"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--tokens: item 2 is 'x'"), std::string::npos) << r.output;
}

TEST(CliArguments, MissingModelFolderIsNamed) {
  auto r = run_command(sluice_command("inspect --model /nonexistent/model"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("/nonexistent/model"), std::string::npos) << r.output;
}

// `plan --json --svg`: one JSON object with the policy and predictions, the SVG written, and a
// real PNG beside it when rsvg-convert is installed (scripts/setup.sh installs it).
TEST(CliPlan, JsonAndRooflinePictures) {
  TempDir d;
  const std::string svg = (d / "roofline.svg").string();
  auto r = run_command(
      sluice_command("plan --preset mixtral-8x7b --layers 1 --requests 16 --prompt-len 64 "
                     "--gen-len 8 --json --svg " +
                     svg),
      false);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_GT(j.at("policy").at("batch").get<int>(), 0);
  EXPECT_GT(j.at("predicted_decode_tokens_per_s").get<double>(), 0);
  EXPECT_GT(j.at("predicted_prefill_tokens_per_s").get<double>(), 0);
  EXPECT_EQ(j.at("svg"), svg);
  std::ifstream in(svg);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("<svg", 0), 0u) << text.substr(0, 80);
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "rsvg-convert is not installed (scripts/setup.sh installs librsvg2-bin): the "
                    "PNG is not checked";
  ASSERT_TRUE(j.contains("png")) << r.output;
  std::ifstream png(j.at("png").get<std::string>(), std::ios::binary);
  char magic[8] = {};
  png.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

}  // namespace
}  // namespace sluice
