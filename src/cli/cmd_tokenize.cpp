// sluice tokenize: text -> ids (one line of space-separated ids per input line) or, with
// --decode, ids -> text. Nothing else is written to stdout, so scripts can compare the output.
#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "io/tokenizer.h"

namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text;
  std::string input;
  bool no_special = false;
  bool decode = false;
};

std::vector<int32_t> parse_ids(const std::string& line, size_t line_no) {
  std::vector<int32_t> ids;
  const char* p = line.data();
  const char* end = p + line.size();
  while (p < end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) ++p;
    if (p == end) break;
    int32_t id;
    auto [next, ec] = std::from_chars(p, end, id);
    if (ec != std::errc() || (next < end && *next != ' ' && *next != '\t' && *next != '\r'))
      sluice::fail("--decode input line {}: expected space-separated integer ids, got '{}'",
                   line_no, line);
    ids.push_back(id);
    p = next;
  }
  return ids;
}

int run(const TokenizeOptions& o) {
  const auto tokenizer = sluice::Tokenizer::load(o.tokenizer);
  std::vector<std::string> lines;
  if (!o.input.empty()) {
    std::ifstream in(o.input, std::ios::binary);
    if (!in) sluice::fail("{}: cannot open input file", o.input);
    for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  } else {
    lines.push_back(o.text);
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (o.decode) {
      out += tokenizer->decode(parse_ids(lines[i], i + 1));
    } else {
      const auto ids = tokenizer->encode(lines[i], !o.no_special);
      for (size_t k = 0; k < ids.size(); ++k) {
        if (k) out += ' ';
        out += std::to_string(ids[k]);
      }
    }
    out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

static sluice::cli::RegisterCommand reg({
    "tokenize",
    "Encode text to token ids (or decode ids) with a checkpoint's tokenizer",
    [](CLI::App& sub) {
      auto o = std::make_shared<TokenizeOptions>();
      sub.add_option("--tokenizer", o->tokenizer,
                     "tokenizer.json, tokenizer.model, *.tiktoken, *.gguf or a model folder")
          ->required();
      auto* text = sub.add_option("--text", o->text, "one input");
      auto* input = sub.add_option("--input", o->input, "file: each line is one input");
      text->excludes(input);
      sub.add_flag("--no-special", o->no_special, "do not add BOS/EOS");
      sub.add_flag("--decode", o->decode, "inputs are space-separated ids; print their text");
      return std::function<int()>([o, text, input] {
        if (text->count() == 0 && input->count() == 0)
          sluice::fail("tokenize: give --text or --input");
        return run(*o);
      });
    },
});

}  // namespace
