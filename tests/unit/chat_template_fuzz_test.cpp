// Robustness of the template parser and renderer against malformed input: truncated and mutated
// real templates and random token soup must end in success or sluice::Error — never a crash,
// another exception type, or a hang (loops and recursion are bounded).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "io/chat_template.h"

namespace sluice {
namespace {

using ojson = nlohmann::ordered_json;

const std::filesystem::path kTokenizers = SLUICE_SOURCE_DIR "/../shared/data/tokenizers";

// Always available, so the fuzz test runs without the shared data too.
const char* const kBuiltinTemplate = R"({%- set ns = namespace(sys='', n=0) -%}
{%- for m in messages if m.role != 'tool' -%}
  {%- if m.role == 'system' %}{% set ns.sys = m.content | trim %}{% continue %}{% endif -%}
  {%- set ns.n = ns.n + 1 -%}
  {{ '<' ~ m.role ~ '>' ~ m.content[:10] ~ (m.tool_calls | default([]) | tojson) }}
  {%- if loop.last and add_generation_prompt %}{{ '<assistant>' }}{% endif -%}
{%- else -%}{{ raise_exception('empty') }}
{%- endfor -%}
{% macro f(x, y=2) %}{{ x * y }}{% endmacro %}{{ f(ns.n) }}{{ ns.sys.split(' ')[::-1] | join(',') }}
{{ {'a': [1, 2.5, none, true]} | items | list }}{# comment #}{{ range(3) | map('string') | join }}
)";

std::vector<std::string> seed_templates() {
  std::vector<std::string> seeds = {kBuiltinTemplate};
  if (!std::filesystem::exists(kTokenizers)) return seeds;
  for (const char* file :
       {"deepseek/chat_templates/deepseek-ai-DeepSeek-V3.2.jinja",
        "deepseek/chat_templates/llama-cpp-deepseek-r1.jinja",
        "qwen/chat_templates/Qwen3-Coder.jinja", "qwen/chat_templates/Qwen-Qwen3-0.6B.jinja"}) {
    std::ifstream in(kTokenizers / file, std::ios::binary);
    seeds.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return seeds;
}

ojson conversation() {
  ojson call = ojson::object();
  call["type"] = "function";
  call["function"] = ojson{{"name", "f"}, {"arguments", {{"a", 1}}}};
  ojson assistant = {{"role", "assistant"},
                     {"content", "<think>r</think>ok"},
                     {"tool_calls", ojson::array({call})}};
  return ojson::array({{{"role", "system"}, {"content", "be brief"}},
                       {{"role", "user"}, {"content", "héllo"}},
                       assistant,
                       {{"role", "tool"}, {"content", "42"}},
                       {{"role", "user"}, {"content", "more"}}});
}

// Parses and renders; returns false (with a recorded failure) when anything but sluice::Error
// escapes.
bool survives(const std::string& source) {
  try {
    ChatTemplate t = ChatTemplate::parse(source, "fuzz");
    t.render(conversation(), true, ojson{{"bos_token", "<s>"}});
  } catch (const Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-sluice exception " << e.what() << " for template:\n" << source;
    return false;
  }
  return true;
}

TEST(ChatTemplateFuzz, TruncatedTemplates) {
  for (const std::string& seed : seed_templates()) {
    size_t step = std::max<size_t>(1, seed.size() / 400);
    for (size_t cut = 0; cut <= seed.size(); cut += step) {
      if (!survives(seed.substr(0, cut))) return;
    }
  }
}

TEST(ChatTemplateFuzz, MutatedTemplates) {
  static const char* const kPieces[] = {"{{",         "}}",
                                        "{%",         "%}",
                                        "{#",         "#}",
                                        "-",          "+",
                                        "(",          ")",
                                        "[",          "]",
                                        "{",          "}",
                                        "'",          "\"",
                                        "\\",         "|",
                                        ".",          ",",
                                        ":",          "=",
                                        "~",          "*",
                                        "**",         "/",
                                        "//",         "%",
                                        " if ",       " for ",
                                        " in ",       " endif ",
                                        " endfor ",   " else ",
                                        " set ",      " not ",
                                        " is ",       " and ",
                                        " or ",       "loop",
                                        "ns",         "messages",
                                        "none",       "0",
                                        "-1",         "99999999999999999999",
                                        "1e999",      "range(100000)",
                                        "\n",         " macro ",
                                        " endmacro ", "raise_exception",
                                        "namespace(", "é",
                                        "\xff",       "\x00"};
  std::mt19937 rng(12345);
  const auto seeds = seed_templates();
  for (int iteration = 0; iteration < 3000; ++iteration) {
    std::string source = seeds[size_t(iteration) % seeds.size()];
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !source.empty(); ++e) {
      size_t pos = rng() % source.size();
      switch (rng() % 3) {
        case 0:
          source.erase(pos, 1 + rng() % 8);
          break;
        case 1:
          source.insert(pos, kPieces[rng() % std::size(kPieces)]);
          break;
        default:
          source[pos] = char(rng() % 256);
          break;
      }
    }
    if (!survives(source)) return;
  }
}

TEST(ChatTemplateFuzz, RandomTokenSoup) {
  static const char* const kTokens[] = {
      "{{ ",       " }}",       "{% ",         " %}",       "{%- ",    " -%}",  "if ",
      "elif ",     "else ",     "endif ",      "for ",      "endfor ", "in ",   "set ",
      "x ",        "= ",        "loop.index ", "messages ", "[",       "]",     "(",
      ")",         "{",         "}",           "'a' ",      "1 ",      "+ ",    "~ ",
      "| length ", "| tojson ", "is defined ", "not ",      "and ",    ", ",    ": ",
      ".",         "[::-1]",    "macro m() ",  "endmacro ", "m() ",    "text ", "\n"};
  std::mt19937 rng(777);
  for (int iteration = 0; iteration < 3000; ++iteration) {
    std::string source;
    int n = 1 + int(rng() % 40);
    for (int i = 0; i < n; ++i) source += kTokens[rng() % std::size(kTokens)];
    if (!survives(source)) return;
  }
}

TEST(ChatTemplateFuzz, HostileButValidTemplatesAreBounded) {
  for (const char* source : {
           "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
           "{% macro r(n) %}{{ r(n) }}{{ r(n) }}{% endmacro %}{{ r(0) }}",
           "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
           "{% endfor %}",
           "{{ 'x' * 99999999999 }}",
           "{{ [1] * 99999999999 }}",
           "{{ 2 ** 99999 }}",
       }) {
    EXPECT_THROW(ChatTemplate::parse(source, "hostile").render(ojson::array(), false), Error)
        << source;
  }
}

}  // namespace
}  // namespace sluice
