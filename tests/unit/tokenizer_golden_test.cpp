// Golden tests: our ids must equal those of the reference tokenizers (Hugging Face `tokenizers`,
// tiktoken) on the real vocabulary files in /work/shared/data/tokenizers (see SOURCES.txt there).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/tokenizer.h"
#include "io/tokenizer/loaders.h"

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
int check_cases(const Tokenizer& t, const std::vector<GoldenCase>& cases, const std::string& name) {
  int passed = 0;
  for (const auto& c : cases) {
    const auto ids = t.encode(c.text, /*add_special_tokens=*/false);
    if (ids == c.ids) {
      ++passed;
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
  std::printf("[golden] loaded %s in %.3f s\n", p.filename().c_str(), s);
  EXPECT_LT(s, 1.0) << "loading " << p << " should take well under a second";
  return t;
}

#define REQUIRE_DATA()                                                                  \
  if (!fs::exists(kData)) GTEST_SKIP() << "no shared tokenizer data at " << kData \
                                       << " (the /work/shared folder is absent)"

class LlamaCppVocabGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCppVocabGolden, MatchesReferenceIds) {
  REQUIRE_DATA();
  const std::string name = GetParam();
  const fs::path dir = kData / "llamacpp-vocab-tests";
  const auto t = timed_load(dir / (name + ".gguf"));
  // Both the current llama.cpp inputs and the older ik_llama.cpp variant (with extra cases).
  check_cases(*t, read_llamacpp_cases(dir / (name + ".gguf.inp"), dir / (name + ".gguf.out")), name);
  const fs::path ik = dir / "ik_llama.cpp-variant";
  if (fs::exists(ik / (name + ".gguf.inp")))
    check_cases(*t, read_llamacpp_cases(ik / (name + ".gguf.inp"), ik / (name + ".gguf.out")),
                name + " (ik variant)");
}

INSTANTIATE_TEST_SUITE_P(Families, LlamaCppVocabGolden,
                         ::testing::Values("ggml-vocab-llama-spm", "ggml-vocab-phi-3",
                                           "ggml-vocab-gpt-2", "ggml-vocab-mpt",
                                           "ggml-vocab-deepseek-llm", "ggml-vocab-deepseek-coder",
                                           "ggml-vocab-falcon", "ggml-vocab-starcoder",
                                           "ggml-vocab-refact"),
                         [](const auto& info) {
                           std::string n = info.param.substr(11);
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace sluice
