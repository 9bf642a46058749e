// Golden tests: our ids must equal those of the reference tokenizers (Hugging Face `tokenizers`,
// tiktoken) on the real vocabulary files in /work/shared/data/tokenizers (see SOURCES.txt there).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/tokenizer.h"
#include "io/tokenizer/loaders.h"
#include "test_util.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

const fs::path kData = fs::path(SLUICE_SOURCE_DIR "/../shared/data/tokenizers");

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct GoldenCase {
  std::string text;
  std::vector<int32_t> ids;
};

// llama.cpp's format: inputs separated by "\n__ggml_vocab_test__\n"; one line of ids per input.
std::vector<GoldenCase> read_llamacpp_cases(const fs::path& inp, const fs::path& out) {
  const std::string all = slurp(inp);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  for (size_t hit; (hit = all.find(sep, pos)) != std::string::npos; pos = hit + sep.size())
    texts.push_back(all.substr(pos, hit - pos));
  if (pos < all.size()) texts.push_back(all.substr(pos));
  std::ifstream ids_in(out);
  std::vector<GoldenCase> cases;
  std::string line;
  for (size_t i = 0; i < texts.size() && std::getline(ids_in, line); ++i) {
    GoldenCase c{texts[i], {}};
    std::istringstream ss(line);
    for (int32_t id; ss >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(cases.size(), texts.size()) << out;
  return cases;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// Returns the number of cases that match; reports each mismatch.
int check_cases(const Tokenizer& t, const std::vector<GoldenCase>& cases, const std::string& name,
                bool expect_roundtrip = false) {
  int passed = 0;
  for (const auto& c : cases) {
    const auto ids = t.encode(c.text, /*add_special_tokens=*/false);
    if (ids == c.ids) {
      ++passed;
      // Byte-level BPE loses nothing (except NFC normalization), so decoding gives the text back.
      if (expect_roundtrip) {
        EXPECT_EQ(t.decode(ids), c.text) << name;
      }
    } else {
      ADD_FAILURE() << name << ": text [" << c.text << "]\n  expected " << show(c.ids)
                    << "\n  got      " << show(ids);
    }
  }
  std::printf("[golden] %s: %d/%zu cases match\n", name.c_str(), passed, cases.size());
  return passed;
}

std::unique_ptr<Tokenizer> timed_load(const fs::path& p) {
  const auto start = std::chrono::steady_clock::now();
  auto t = Tokenizer::load(p);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Printed, not asserted: a wall-clock bound fails on a loaded machine for no fault of the code.
  std::printf("[golden] loaded %s in %.3f s\n", p.filename().c_str(), s);
  return t;
}

#define REQUIRE_DATA()    \
  if (!fs::exists(kData)) \
  GTEST_SKIP() << "no shared tokenizer data at " << kData << " (the /work/shared folder is absent)"

class LlamaCppVocabGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCppVocabGolden, MatchesReferenceIds) {
  REQUIRE_DATA();
  const std::string name = GetParam();
  const fs::path dir = kData / "llamacpp-vocab-tests";
  const auto t = timed_load(dir / (name + ".gguf"));
  // Both the current llama.cpp inputs and the older ik_llama.cpp variant (with extra cases).
  const bool roundtrip = name == "ggml-vocab-gpt-2" || name == "ggml-vocab-starcoder";
  check_cases(*t, read_llamacpp_cases(dir / (name + ".gguf.inp"), dir / (name + ".gguf.out")), name,
              roundtrip);
  const fs::path ik = dir / "ik_llama.cpp-variant";
  if (fs::exists(ik / (name + ".gguf.inp")))
    check_cases(*t, read_llamacpp_cases(ik / (name + ".gguf.inp"), ik / (name + ".gguf.out")),
                name + " (ik variant)");
}

INSTANTIATE_TEST_SUITE_P(
    Families, LlamaCppVocabGolden,
    ::testing::Values("ggml-vocab-llama-spm", "ggml-vocab-phi-3", "ggml-vocab-gpt-2",
                      "ggml-vocab-mpt", "ggml-vocab-deepseek-llm", "ggml-vocab-deepseek-coder",
                      "ggml-vocab-falcon", "ggml-vocab-starcoder", "ggml-vocab-refact"),
    [](const auto& param_info) { return testing::test_name(param_info.param.substr(11)); });

std::vector<GoldenCase> qwen2_cases() {
  const fs::path ik = kData / "llamacpp-vocab-tests/ik_llama.cpp-variant";
  return read_llamacpp_cases(ik / "ggml-vocab-qwen2.gguf.inp", ik / "ggml-vocab-qwen2.gguf.out");
}

// Qwen2/2.5/3 (and their MoE variants) share one BPE; vocab.json + merges.txt carry it.
TEST(TokenizerGolden, Qwen2VocabAndMerges) {
  REQUIRE_DATA();
  const fs::path dir = kData / "qwen";
  const auto start = std::chrono::steady_clock::now();
  auto parts = tok::read_vocab_and_merges(dir / "vocab.json", dir / "merges.txt", "qwen2");
  const auto config = tok::read_tokenizer_config(dir / "tokenizer_config.qwen2.5.json");
  const auto t = tok::build_tokenizer(std::move(parts), &config);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[golden] loaded qwen vocab.json + merges.txt in %.3f s\n", s);
  check_cases(*t, qwen2_cases(), "qwen2 vocab.json+merges.txt");
  EXPECT_EQ(t->eos_id(), 151645);  // <|im_end|>
  EXPECT_EQ(t->encode("<|im_start|>user", true), (std::vector<int32_t>{151644, 872}));
}

// Qwen 1's tiktoken file holds the same ranks, so the same reference ids apply.
TEST(TokenizerGolden, QwenTiktoken) {
  REQUIRE_DATA();
  const auto t = timed_load(kData / "qwen/qwen.tiktoken");
  check_cases(*t, qwen2_cases(), "qwen.tiktoken");
  EXPECT_EQ(t->eos_id(), 151643);
}

// OLMoE's tokenizer is GPT-NeoX-20B's BPE with extra tokens; MPT uses GPT-NeoX-20B's tokenizer,
// so llama.cpp's MPT reference ids apply to the regular tokens.
TEST(TokenizerGolden, OlmoeTokenizerJsonAgainstGptNeoxIds) {
  REQUIRE_DATA();
  const fs::path dir = kData / "llamacpp-vocab-tests";
  const auto cases =
      read_llamacpp_cases(dir / "ggml-vocab-mpt.gguf.inp", dir / "ggml-vocab-mpt.gguf.out");
  for (const char* name : {"allenai_gpt-neox-olmo-dolma-v1_5.json",
                           "allenai_eleuther-ai-gpt-neox-20b-pii-special.json"}) {
    const auto t = timed_load(kData / "olmoe" / name);
    check_cases(*t, cases, name);
  }
  const auto t = Tokenizer::load(kData / "olmoe/allenai_gpt-neox-olmo-dolma-v1_5.json");
  EXPECT_EQ(t->eos_id(), 50279);  // <|endoftext|> in OLMoE
  EXPECT_EQ(t->encode("a|||IP_ADDRESS|||b", false), t->encode("a|||IP_ADDRESS|||b", false));
}

// Mixtral has no published reference ids here; libsentencepiece on tokenizer.model is the
// reference implementation of its tokenizer, so tokenizer.json (our BPE) must agree with it.
// `hf_metaspace_first`: the newer ("non-legacy") files use Hugging Face's Metaspace pre-tokenizer
// with prepend_scheme "first", which by design differs from SentencePiece on text that starts with
// a space (no second U+2581 is prepended) and after special tokens (no U+2581 at all); those
// inputs are left out of the comparison for such files.
void expect_agreement(const Tokenizer& reference, const Tokenizer& ours, const std::string& name,
                      bool hf_metaspace_first = false) {
  const fs::path dir = kData / "llamacpp-vocab-tests/ik_llama.cpp-variant";
  auto texts = read_llamacpp_cases(dir / "ggml-vocab-llama-spm.gguf.inp",
                                   dir / "ggml-vocab-llama-spm.gguf.out");
  texts.push_back({"[INST] What is your favourite condiment? [/INST]", {}});
  texts.push_back({"<s>[INST] Hi</s>", {}});
  std::vector<GoldenCase> cases;
  for (auto& c : texts) {
    if (hf_metaspace_first && (c.text.starts_with(' ') || c.text.find("<s>") != std::string::npos ||
                               c.text.find("[INST]") != std::string::npos))
      continue;
    cases.push_back({c.text, reference.encode(c.text, false)});
  }
  check_cases(ours, cases, name);
  EXPECT_EQ(ours.encode("Hello", true), reference.encode("Hello", true));
}

TEST(TokenizerGolden, MixtralTokenizerJsonAgreesWithSentencePiece) {
  REQUIRE_DATA();
  const fs::path dir = kData / "mixtral";
  const auto sp = timed_load(dir / "tokenizer.model");
  expect_agreement(*sp, *timed_load(dir / "tokenizer.json"), "mixtral tokenizer.json (legacy)");
  expect_agreement(*sp, *timed_load(dir / "mistral-7b-v0.1-hf-nonlegacy/tokenizer.json"),
                   "mistral tokenizer.json (Metaspace)", true);
  const auto sp3 = timed_load(dir / "v3-32768/tokenizer.model.v3");
  expect_agreement(*sp3, *timed_load(dir / "v3-32768/tokenizer.json"), "mixtral v3 tokenizer.json",
                   true);
}

// DBRX uses OpenAI's cl100k_base. Reference ids: tiktoken-rs tests/tiktoken.rs (cl100k_base_test),
// repo zurawiki/tiktoken-rs, the project the shared cl100k_base.tiktoken file comes from.
TEST(TokenizerGolden, DbrxCl100kTiktoken) {
  REQUIRE_DATA();
  const auto t = timed_load(kData / "dbrx/cl100k_base.tiktoken");
  const std::string text = "This is a test         with a lot of spaces";
  const std::vector<int32_t> want = {2028, 374, 264, 1296, 260, 449, 264, 2763, 315, 12908};
  EXPECT_EQ(t->encode(text), want);
  auto with_eot = want;
  with_eot.push_back(100257);
  EXPECT_EQ(t->encode(text + "<|endoftext|>"), with_eot);
  EXPECT_EQ(t->eos_id(), 100257);
  // Lossless round trips, including the long example text shipped with the file.
  for (const std::string& s :
       {std::string("\xF0\x9F\x8D\x8CThis is a sentence"),
        std::string(
            "\xE4\xBD\xA0\xE4\xBC\x9A\xE8\xAF\xB4\xE4\xB8\xAD\xE6\x96\x87\xE5\x90\x97\xEF\xBC\x9F"),
        slurp(kData / "dbrx/example_text.txt")})
    EXPECT_EQ(t->decode(t->encode(s)), s);
}

// Llama-3's BPE extends cl100k_base's ranks with 28k more, merged only after every cl100k merge
// (tiktoken merges lowest rank first). So where llama.cpp's Llama-3 reference ids all lie below
// 100256 no extension token took part, and cl100k must give the same ids. (Llama-3's own
// vocabulary file is not in the shared data.)
TEST(TokenizerGolden, Cl100kAgreesWithLlama3IdsBelow100256) {
  REQUIRE_DATA();
  const auto t = Tokenizer::load(kData / "dbrx/cl100k_base.tiktoken");
  const fs::path dir = kData / "llamacpp-vocab-tests";
  std::vector<GoldenCase> cases;
  for (auto& c : read_llamacpp_cases(dir / "ggml-vocab-llama-bpe.gguf.inp",
                                     dir / "ggml-vocab-llama-bpe.gguf.out"))
    if (std::all_of(c.ids.begin(), c.ids.end(), [](int32_t id) { return id < 100256; }))
      cases.push_back(std::move(c));
  EXPECT_GT(cases.size(), 30u);
  check_cases(*t, cases, "cl100k vs llama-bpe ids < 100256", true);
}

}  // namespace
}  // namespace sluice
