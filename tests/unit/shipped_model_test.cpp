// The model that ships with sluice (models/moby-moe, made by scripts/train-demo-model.py): it
// loads, it continues prompts with real English words, and `sluice perplexity` gives what the
// training script's own evaluation gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "model/weights.h"
#include "test_util.h"

namespace sluice {
namespace {

const std::filesystem::path kModel = std::filesystem::path(SLUICE_SOURCE_DIR) / "models/moby-moe";
constexpr const char* kDictionary = "/usr/share/dict/words";  // Debian's wamerican
constexpr const char* kPython = "/usr/bin/python3";

// Written for this test (not from the training corpus): plain English prose about the sea.
constexpr const char* kText =
    "The old ship lay at anchor in the harbour, and the men on her deck were mending the sails "
    "before the next voyage. The captain walked slowly up and down, looking now at the sky and "
    "now at the water, for he knew that the weather would change before the morning. A boy "
    "climbed the mast to see what lay beyond the point of land, and he called down that there "
    "were two boats coming in from the sea. The mate went to the side and watched them come, "
    "and he said nothing for a long time. When the boats were near, the men could see that they "
    "were full of fish, and that the sailors in them were tired and wet, for they had been out "
    "all night in the cold wind. The captain gave orders that they should have food and a "
    "warm place by the fire. Then he went down into his cabin and sat alone with his charts, "
    "thinking of the long months that were to come, of the great waters and the strange lands, "
    "and of the whales that his men would hunt in the southern seas. He had been a sailor all "
    "his life, and his father before him, and he did not fear the ocean; but he knew how it "
    "could turn upon a man in a single hour, and how small a ship is upon the face of the deep. "
    "In the evening the wind rose, and the rain came down upon the town, and the lamps were lit "
    "in every window along the shore. The sailors sang in the inn, and some of them spoke of "
    "home, and some of the money they would bring back, and some said nothing at all, but sat "
    "and looked into the fire, as men do who have seen much of the world and found it hard.";

std::set<std::string> dictionary() {
  std::set<std::string> words;
  std::ifstream in(kDictionary);
  for (std::string w; std::getline(in, w);) {
    std::transform(w.begin(), w.end(), w.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    words.insert(w);
  }
  return words;
}

// The alphabetic words of `text`, lowercased; an apostrophe's tail ("ship's") dropped.
std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> out;
  std::string w;
  auto flush = [&] {
    if (!w.empty()) out.push_back(w);
    w.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char ch = static_cast<unsigned char>(text[i]);
    if (std::isalpha(ch)) {
      w += char(std::tolower(ch));
    } else {
      flush();
      if (ch == '\'')
        while (i + 1 < text.size() && std::isalpha(static_cast<unsigned char>(text[i + 1]))) ++i;
    }
  }
  flush();
  return out;
}

TEST(ShippedModel, LoadsAsAMixtralMoe) {
  const Model m = load_model(kModel);
  EXPECT_EQ(m.config.architecture, "MixtralForCausalLM");
  EXPECT_GE(m.config.num_experts, 4);
  EXPECT_EQ(m.config.experts_per_token, 2);
  EXPECT_GE(m.config.num_layers, 2);
  size_t bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(kModel)) bytes += e.file_size();
  EXPECT_LE(bytes, size_t(25) << 20) << "the shipped folder must stay within 25 MB";
}

// Greedy continuations of openings of held-out chapters (every tenth chapter is held out of
// training): at least 90% of their words are English dictionary words.
TEST(ShippedModel, ContinuesHeldOutPromptsWithRealWords) {
  if (!std::filesystem::exists(kDictionary))
    GTEST_SKIP() << kDictionary
                 << " is absent (Debian's wamerican, which scripts/setup.sh installs)";
  const std::set<std::string> dict = dictionary();
  testing::TempDir dir;
  const char* prompts[] = {"A day or two passed, and there was great",
                           "When Stubb had departed, Ahab stood for a while",
                           "Returning to the Spouter-Inn from the Chapel, I found",
                           "It should not have been omitted that"};
  std::string lines;
  for (const char* p : prompts) lines += std::string(p) + "\n";
  testing::write_file(dir / "prompts.txt", lines);
  auto r = testing::run_command(
      testing::sluice_command("generate --model " + kModel.string() + " --input " +
                              (dir / "prompts.txt").string() + " --max-new-tokens 32"),
      false);
  ASSERT_EQ(r.status, 0) << r.output;
  std::string continuations;
  std::istringstream out(r.output);
  for (std::string line; std::getline(out, line);) {
    for (const char* p : prompts) {
      const size_t at = line.find(p);
      if (at == std::string::npos) continue;
      continuations += ' ';
      continuations += line.substr(at + std::strlen(p));
    }
  }
  const std::vector<std::string> words = words_of(continuations);
  ASSERT_GE(words.size(), 20u) << r.output;
  size_t known = 0;
  std::string unknown;
  for (const auto& w : words) {
    if (dict.count(w)) {
      ++known;
    } else {
      unknown += " " + w;
    }
  }
  EXPECT_GE(double(known) / double(words.size()), 0.9)
      << "words not in " << kDictionary << ":" << unknown << "\n"
      << r.output;
}

// The same text, windows and scoring on both sides: sluice's engine (bf16 weights, activations
// rounded to bf16 at each GEMM) and the training script's PyTorch forward (fp32 activations),
// within 1% of each other.
TEST(ShippedModel, PerplexityEqualsTheTrainingScriptsEvaluation) {
  if (testing::run_command(std::string(kPython) + " -c 'import torch'").status != 0)
    GTEST_SKIP() << kPython << " cannot import torch (Debian's python3-torch)";
  testing::TempDir dir;
  testing::write_file(dir / "text.txt", kText);
  const std::string args = " --text " + (dir / "text.txt").string() + " --ctx 64";
  auto torch =
      testing::run_command(std::string(kPython) + " " + SLUICE_SOURCE_DIR +
                               "/scripts/train-demo-model.py --eval " + kModel.string() + args,
                           false);
  ASSERT_EQ(torch.status, 0) << torch.output;
  auto ours = testing::run_command(
      testing::sluice_command("perplexity --model " + kModel.string() + " --file " +
                              (dir / "text.txt").string() + " --ctx 64 --json"),
      false);
  ASSERT_EQ(ours.status, 0) << ours.output;
  const auto want = nlohmann::json::parse(torch.output);
  const auto got = nlohmann::json::parse(ours.output);
  EXPECT_EQ(got["tokens_scored"], want["tokens_scored"]);
  const double ppl = want["perplexity"].get<double>();
  EXPECT_NEAR(got["perplexity"].get<double>(), ppl, 0.01 * ppl) << ours.output;
  // A model that has learned English: far below the ~2048 of a uniform guess.
  EXPECT_LT(ppl, 200.0);
}

}  // namespace
}  // namespace sluice
