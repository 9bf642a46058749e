// The Jinja subset, construct by construct. Expected strings follow Jinja2 + Python semantics
// with transformers' settings (trim_blocks, lstrip_blocks, no trailing newline kept).
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/chat_template.h"

namespace sluice {
namespace {

using ojson = nlohmann::ordered_json;

std::string render(const std::string& source, const ojson& context = ojson::object(),
                   const ojson& messages = ojson::array()) {
  return ChatTemplate::parse(source, "test.jinja").render(messages, false, context);
}

std::string error_of(const std::string& source, const ojson& context = ojson::object()) {
  try {
    render(source, context);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ChatTemplateLanguage, TextAndOutput) {
  EXPECT_EQ(render("hello"), "hello");
  EXPECT_EQ(render("a{{ 1 + 2 }}b"), "a3b");
  EXPECT_EQ(render("{{ x }}|{{ y }}", {{"x", "X"}}), "X|");  // undefined prints nothing
  EXPECT_EQ(render("{# comment #}ok"), "ok");
  // One trailing newline is dropped (keep_trailing_newline=False); others stay.
  EXPECT_EQ(render("line\n"), "line");
  EXPECT_EQ(render("line\n\n"), "line\n");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
}

TEST(ChatTemplateLanguage, PythonStrOfValues) {
  EXPECT_EQ(render("{{ none }}{{ None }}"), "NoneNone");
  EXPECT_EQ(render("{{ true }} {{ False }}"), "True False");
  EXPECT_EQ(render("{{ 1.0 }} {{ 0.1 }} {{ 1e16 }} {{ 1.5e-5 }} {{ 2.50 }}"),
            "1.0 0.1 1e+16 1.5e-05 2.5");
  EXPECT_EQ(render("{{ [1, 'a', none, true] }}"), "[1, 'a', None, True]");
  EXPECT_EQ(render("{{ {'k': \"it's\", 'n': [1.5]} }}"), "{'k': \"it's\", 'n': [1.5]}");
  EXPECT_EQ(render("{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }}"),
            "3.5 3 -4 2 1024");
}

TEST(ChatTemplateLanguage, WhitespaceControl) {
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("a \n {%- if true -%} \n b {%- endif %}"), "ab");
  // trim_blocks: the newline after a block tag goes; after {{ }} it stays.
  EXPECT_EQ(render("{% if true %}\nx\n{% endif %}\ny"), "x\ny");
  EXPECT_EQ(render("{{ 'v' }}\nz"), "v\nz");
  // lstrip_blocks: indentation before a block tag on its own line goes.
  EXPECT_EQ(render("<\n    {% if true %}\n    x\n    {% endif %}\n>"), "<\n    x\n>");
  // ... but not when text precedes the tag on that line.
  EXPECT_EQ(render("a  {% if true %}b{% endif %}"), "a  b");
  // {%+ and +%} disable lstrip_blocks / trim_blocks for that tag.
  EXPECT_EQ(render("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(render("  {# note #}\nx"), "x");
}

TEST(ChatTemplateLanguage, IfElifElse) {
  const std::string t = "{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(render(t, {{"n", 1}}), "one");
  EXPECT_EQ(render(t, {{"n", 2}}), "two");
  EXPECT_EQ(render(t, {{"n", 5}}), "many");
  EXPECT_EQ(render("{{ 'y' if x else 'n' }}{{ 'z' if x }}", {{"x", false}}), "n");
}

TEST(ChatTemplateLanguage, ForLoopVariables) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ x }}"
                   "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %}"
                   "{{ loop.length }}{{ loop.revindex }};{% endfor %}",
                   {{"xs", {"a", "b", "c"}}}),
            "10aF33;21b32;32cL31;");
  EXPECT_EQ(render("{% for x in xs if x > 1 %}{{ loop.index }}:{{ x }} {% endfor %}",
                   {{"xs", {1, 2, 3}}}),
            "1:2 2:3 ");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.previtem }}>{{ x }}<{{ loop.nextitem }} {% endfor %}",
                   {{"xs", {1, 2}}}),
            ">1<2 1>2< ");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
                   "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "013");
}

TEST(ChatTemplateLanguage, ForOverDicts) {
  ojson d = ojson::object();
  d["zeta"] = 1;
  d["alpha"] = 2;  // insertion order, not sorted
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", {{"d", d}}),
            "zeta=1,alpha=2,");
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", {{"d", d}}), "zetaalpha");
  EXPECT_EQ(render("{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}", {{"d", d}}),
            "zeta1alpha2");
  EXPECT_EQ(render("{% for k, v in d.items() if k != 'zeta' %}{{ k }}{% endfor %}", {{"d", d}}),
            "alpha");
}

TEST(ChatTemplateLanguage, SetScopingAndNamespace) {
  // A set inside a loop does not leak out; a namespace attribute does.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{% endfor %}{{ x }}"),
            "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}"
                   "{% endfor %}{{ ns.x }}"),
            "4");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.a = 'A' %}{{ ns.a }}"), "A");
  // `if` does not open a scope.
  EXPECT_EQ(render("{% if true %}{% set y = 'in' %}{% endif %}{{ y }}"), "in");
  EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set block %}x{{ 1 }}y{% endset %}[{{ block }}]"), "[x1y]");
}

TEST(ChatTemplateLanguage, Macros) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('Ann') }} {{ greet('Bo', punct='?') }}"),
            "Hi Ann! Hi Bo?");
  // A macro sees template-level variables and can change namespaces.
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% macro bump() %}{% set ns.n = ns.n + 1 %}"
                   "{% endmacro %}{{ bump() }}{{ bump() }}{{ ns.n }}"),
            "2");
}

TEST(ChatTemplateLanguage, Operators) {
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }}"), "a1None");
  EXPECT_EQ(render("{{ [1] + [2] }}"), "[1, 2]");
  EXPECT_EQ(render("{{ 'ab' * 3 }}"), "ababab");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"), "True False");
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [3] }}"),
            "True True True False");
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'a' }} {{ [1, 'x'] == [1, 'x'] }}"),
            "True True False True");
  // and/or return an operand.
  EXPECT_EQ(render("{{ '' or 'fallback' }} {{ 'x' and 'y' }} {{ none or '' }}|"), "fallback y |");
  EXPECT_EQ(render("{{ not 0 }} {{ -(3) }} {{ - 2 ** 2 }}"), "True -3 4");
  // Filters bind tighter than arithmetic.
  EXPECT_EQ(render("{{ 'n=' + xs | length | string }}", {{"xs", {1, 2, 3}}}), "n=3");
}

TEST(ChatTemplateLanguage, SubscriptsAndSlices) {
  ojson ctx = {{"xs", {10, 20, 30, 40}}, {"s", "héllo"}, {"d", {{"k", "v"}}}};
  EXPECT_EQ(render("{{ xs[0] }} {{ xs[-1] }} {{ xs[1:3] }} {{ xs[::-1] }} {{ xs[::2] }}", ctx),
            "10 40 [20, 30] [40, 30, 20, 10] [10, 30]");
  EXPECT_EQ(render("{{ xs[:-1] }} {{ xs[-2:] }} {{ xs[5:] }} {{ xs[3:0:-1] }}", ctx),
            "[10, 20, 30] [30, 40] [] [40, 30, 20]");
  // Strings index by code point.
  EXPECT_EQ(render("{{ s[1] }} {{ s[:-1] }} {{ s[::-1] }} {{ s | length }}", ctx),
            "é héll olléh 5");
  EXPECT_EQ(render("{{ d.k }} {{ d['k'] }} {{ d.missing is defined }} {{ xs[9] is defined }}", ctx),
            "v v False False");
}

TEST(ChatTemplateLanguage, Literals) {
  EXPECT_EQ(render("{{ \"a\\tb\\n\" }}"), "a\tb\n");
  EXPECT_EQ(render("{{ 'it\\'s' }} {{ '\\u00e9' }} {{ 'x' 'y' }}"), "it's é xy");
  EXPECT_EQ(render("{{ 1_000 }} {{ (1, 2) | length }} {{ {'a': [1, {'b': none}]} }}"),
            "1000 2 {'a': [1, {'b': None}]}");
  EXPECT_EQ(render("{{ [1, 2,] | length }}"), "2");
}

TEST(ChatTemplateLanguage, Filters) {
  ojson ctx = {{"s", "  Hello World  "}, {"xs", {"b", "a", "b"}}};
  EXPECT_EQ(render("[{{ s | trim }}] [{{ s | upper }}] [{{ s | lower | trim }}]", ctx),
            "[Hello World] [  HELLO WORLD  ] [hello world]");
  EXPECT_EQ(render("{{ xs | join('-') }} {{ xs | first }} {{ xs | last }} {{ xs | length }}", ctx),
            "b-a-b b b 3");
  EXPECT_EQ(render("{{ missing | default('dflt') }} {{ '' | default('e', true) }} {{ 0 | d(5) }}"),
            "dflt e 0");
  EXPECT_EQ(render("{{ 'a-b-c' | replace('-', '+') }} {{ 12 | string ~ '!' }}"), "a+b+c 12!");
  EXPECT_EQ(
      render("{{ xs | unique | list }} {{ xs | reverse | join }} {{ 'hi there' | title }}", ctx),
      "['b', 'a'] bab Hi There");
  EXPECT_EQ(render("{{ '3' | int + 1 }} {{ 'x' | int }} {{ 2 | float }} {{ -4 | abs }}"),
            "4 0 2.0 4");
  EXPECT_EQ(render("{{ '<a>' | e }}"), "&lt;a&gt;");
}

TEST(ChatTemplateLanguage, ToJsonMatchesPythonJsonDumps) {
  ojson v = ojson::object();
  v["name"] = "f\"1\"\n";
  v["args"] = {1, 2.5, true, nullptr, "é"};
  v["empty"] = ojson::object();
  EXPECT_EQ(render("{{ v | tojson }}", {{"v", v}}),
            R"({"name": "f\"1\"\n", "args": [1, 2.5, true, null, "é"], "empty": {}})");
  EXPECT_EQ(render("{{ v | tojson(indent=2) }}", {{"v", {{"a", {1, 2}}}}}),
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
  EXPECT_EQ(render("{{ v | tojson(ensure_ascii=true) }}", {{"v", "é😀"}}),
            R"("\u00e9\ud83d\ude00")");
  EXPECT_EQ(render("{{ v | tojson(sort_keys=true, separators=(',', ':')) }}",
                   {{"v", {{"b", 1}, {"a", 2}}}}),
            R"({"a":2,"b":1})");
  EXPECT_EQ(render("{{ '<&>' | tojson }}"), "\"<&>\"");  // no HTML escaping (transformers)
  EXPECT_EQ(render("{{ v | tojson(indent='\t') }}", {{"v", {{"a", {1}}}}}),
            "{\n\t\"a\": [\n\t\t1\n\t]\n}");  // a string indent is used as it is
}

// map, select, reject, selectattr, rejectattr and unique return Python generators in Jinja2.
TEST(ChatTemplateLanguage, FilterResultsAreGenerators) {
  EXPECT_EQ(render("{{ 'yes' if [] | select else 'no' }}"), "yes");  // always true
  EXPECT_EQ(render("{{ (['a'] | map('upper'))[0] }}|"), "|");        // not subscriptable
  EXPECT_EQ(render("{{ ['a'] | map('upper') | list | tojson }}"), "[\"A\"]");
  EXPECT_EQ(render("{{ [1, 1] | unique | list }}"), "[1]");
  EXPECT_EQ(render("{{ [1] | select is sequence }} {{ [1] | select is iterable }}"),
            "False True");
  EXPECT_NE(error_of("{{ ['a'] | map('upper') | tojson }}")
                .find("Object of type generator is not JSON serializable"),
            std::string::npos);
  EXPECT_NE(error_of("{{ [1] | select | length }}").find("object of type 'generator' has no len()"),
            std::string::npos);
  EXPECT_EQ(error_of("{{ [1] | select + [2] }}").find("(no error)"), std::string::npos);
}

TEST(ChatTemplateLanguage, SelectMapFilters) {
  ojson msgs = ojson::array({{{"role", "system"}, {"content", "S"}},
                             {{"role", "user"}, {"content", "U1"}},
                             {{"role", "user"}, {"content", "U2"}}});
  ojson ctx = {{"m", msgs}};
  EXPECT_EQ(render("{{ m | selectattr('role', 'equalto', 'user') | map(attribute='content') | "
                   "join(',') }}",
                   ctx),
            "U1,U2");
  EXPECT_EQ(render("{{ m | rejectattr('role', 'eq', 'user') | list | length }}", ctx), "1");
  EXPECT_EQ(render("{{ [0, 1, 2, ''] | select | list }} {{ [1, 2, 3] | reject('odd') | list }}"),
            "[1, 2] [2]");
  EXPECT_EQ(render("{{ ['a', 'b'] | map('upper') | join }}"), "AB");
}

TEST(ChatTemplateLanguage, Tests) {
  ojson ctx = {{"s", "x"},   {"n", nullptr}, {"d", ojson::object()}, {"l", ojson::array()},
               {"b", false}, {"i", 3}};
  EXPECT_EQ(render("{{ s is string }}{{ n is none }}{{ d is mapping }}{{ l is iterable }}"
                   "{{ s is iterable }}{{ i is iterable }}{{ u is defined }}{{ u is undefined }}",
                   ctx),
            "TrueTrueTrueTrueTrueFalseFalseTrue");
  EXPECT_EQ(render("{{ b is false }}{{ b is true }}{{ i is number }}{{ i is integer }}"
                   "{{ b is integer }}{{ i is odd }}{{ i is divisibleby 3 }}{{ s is not none }}",
                   ctx),
            "TrueFalseTrueTrueFalseTrueTrueTrue");
  EXPECT_EQ(render("{{ n is not string and not u is defined }}", ctx), "True");
  EXPECT_EQ(render("{{ l is sequence }}{{ d is sequence }}{{ i is sequence }}", ctx),
            "TrueTrueFalse");
}

TEST(ChatTemplateLanguage, StringMethods) {
  ojson ctx = {{"s", "<think>\nplan\n</think>\n\nanswer"}};
  EXPECT_EQ(render("{{ s.split('</think>')[-1].lstrip('\\n') }}", ctx), "answer");
  EXPECT_EQ(
      render("{{ s.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", ctx),
      "plan");
  EXPECT_EQ(render("{{ s.startswith('<think>') }}{{ s.endswith('x') }}"
                   "{{ s.startswith(('a', '<')) }}",
                   ctx),
            "TrueFalseTrue");
  EXPECT_EQ(render("[{{ '  a b  '.strip() }}][{{ 'xxaxx'.strip('x') }}][{{ ' a'.lstrip() }}]"),
            "[a b][a][a]");
  EXPECT_EQ(
      render("{{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }}"),
      "['a', 'b'] ['a', 'b,c'] ['a,b', 'c']");
  EXPECT_EQ(render("{{ 'ab'.upper() }}{{ 'AB'.lower() }}{{ 'a-b'.replace('-', '') }}"
                   "{{ ', '.join(['x', 'y']) }}{{ 'abc'.find('c') }}"),
            "ABabab"
            "x, y2");
  // The rest of str's methods, each against what Python prints.
  EXPECT_EQ(render("{{ '123'.isdigit() }}{{ ''.isdigit() }}{{ 'ab'.isalpha() }}{{ 'a1'.isalpha() }}"
                   "{{ 'a1'.isalnum() }}{{ ' \t'.isspace() }}{{ 'a '.isspace() }}"),
            "TrueFalseTrueFalseTrueTrueFalse");
  EXPECT_EQ(render("{{ 'hELLO wORLD'.capitalize() }}|{{ 'hello world'.title() }}|"
                   "{{ 'ab'.replace('', '-') }}|{{ 'ab'.replace('', '-', 2) }}|"
                   "{{ 'aaa'.replace('a', 'b', 2) }}"),
            "Hello world|Hello World|-a-b-|-a-b|bba");
  EXPECT_EQ(render("{{ 'h\u00e9llo'.count('') }} {{ 'aaaa'.count('aa') }} "
                   "{{ 'h\u00e9llo'.find('l') }} {{ 'abc'.find('z') }} {{ 'xxhixx'.rstrip('x') }}"),
            "6 2 2 -1 xxhi");
  EXPECT_EQ(error_of("{{ 'a'.nosuchmethod() }}"),
            "test.jinja:1:7: 'str object' has no attribute 'nosuchmethod'");
  EXPECT_EQ(render("{{ d.get('k') }} {{ d.get('z', 'dflt') }} {{ d.keys() | list }} {{ d.values() "
                   "| list }}",
                   {{"d", {{"k", "v"}}}}),
            "v dflt ['k'] ['v']");
}

TEST(ChatTemplateLanguage, GlobalsAndExtensions) {
  EXPECT_EQ(render("{{ range(3) }} {{ range(1, 7, 2) }} {{ dict(a=1) }}"),
            "[0, 1, 2] [1, 3, 5] {'a': 1}");
  EXPECT_EQ(render("{% generation %}kept{% endgeneration %}"), "kept");
  EXPECT_EQ(render("{% raw %}{{ not evaluated }}{% endraw %}"), "{{ not evaluated }}");
  EXPECT_EQ(render("{{ '{\"a\": [1]}' | from_json | tojson }}"), "{\"a\": [1]}");
  // strftime_now reads the clock; check the shape only (four-digit year).
  std::string year = render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_TRUE(std::all_of(year.begin(), year.end(), ::isdigit)) << year;
}

TEST(ChatTemplateLanguage, RaiseException) {
  EXPECT_EQ(error_of("line1\n{{ raise_exception('Bad roles!') }}"),
            "test.jinja:2:4: template raised an exception: Bad roles!");
}

TEST(ChatTemplateLanguage, ParseErrorsNamePositionAndExpectation) {
  EXPECT_EQ(error_of("{% if x %}\nabc"),
            "test.jinja:2:4: expected 'elif' or 'else' or 'endif' to close 'if' opened at line "
            "1, got end of template");
  EXPECT_EQ(error_of("{{ 1 + }}"), "test.jinja:1:8: expected an expression, got '}}'");
  EXPECT_EQ(error_of("a\n  {% for x xs %}{% endfor %}"),
            "test.jinja:2:12: expected 'in', got 'xs'");
  EXPECT_EQ(error_of("{{ 'abc }}"), "test.jinja:1:4: unterminated string literal");
  EXPECT_EQ(error_of("{% include 'x' %}"), "test.jinja:1:1: unknown or unsupported tag 'include'");
  EXPECT_EQ(error_of("{% endif %}"), "test.jinja:1:1: unexpected 'endif': no open block to close");
  EXPECT_EQ(error_of("{# open"), "test.jinja:1:1: unterminated comment: expected '#}'");
  EXPECT_EQ(error_of("{{ x"),
            "test.jinja:1:1: unterminated tag: expected '}}' before the end of template");
}

TEST(ChatTemplateLanguage, RuntimeErrors) {
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"),
            "test.jinja:1:8: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(error_of("{{ x.y }}"), "test.jinja:1:5: 'x' is undefined");
  EXPECT_EQ(error_of("{{ m.a.b }}", {{"m", ojson::object()}}),
            "test.jinja:1:7: 'dict object' has no attribute 'a'");
  EXPECT_EQ(error_of("{{ none | length }}"),
            "test.jinja:1:9: object of type 'NoneType' has no len()");
  EXPECT_EQ(error_of("{% set x = 1 %}{% set x.a = 2 %}"),
            "test.jinja:1:16: cannot assign attribute 'a' on 'x': only namespace() objects can be "
            "modified");
  // A namespace that held itself would never be freed (found by fuzz_jinja as a leak).
  EXPECT_EQ(error_of("{% set ns = namespace(n=0) %}{% set ns.n = ns %}"),
            "test.jinja:1:30: cannot assign attribute 'n' on 'ns': the value holds 'ns' itself, "
            "and a namespace cannot contain itself");
  EXPECT_EQ(error_of("{% set a = namespace() %}{% set b = namespace(x=[{'k': a}]) %}"
                     "{% set a.y = [1, b] %}"),
            "test.jinja:1:63: cannot assign attribute 'y' on 'a': the value holds 'a' itself, and "
            "a namespace cannot contain itself");
  EXPECT_EQ(render("{% set a = namespace() %}{% set b = namespace(v=1) %}{% set a.b = [b, b] %}"
                   "{% set b.v = 2 %}{{ a.b[1].v }}"),
            "2");
  EXPECT_EQ(error_of("{{ [1].append(2) }}"),
            "test.jinja:1:7: access to attribute 'append' of 'list' object is unsafe: templates "
            "cannot modify data");
  EXPECT_EQ(error_of("{{ x | nosuch }}"), "test.jinja:1:6: no filter named 'nosuch'");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "test.jinja:1:6: integer division or modulo by zero");
}

TEST(ChatTemplateLanguage, ResourceLimits) {
  EXPECT_EQ(error_of("{{ range(200000) | length }}"),
            "test.jinja:1:4: range too big: the sandbox allows at most 100000 items");
  EXPECT_EQ(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
            "test.jinja:1:20: macro calls nested deeper than 64");
  std::string deep = std::string(300, '(') + "1" + std::string(300, ')');
  EXPECT_EQ(error_of("{{ " + deep + " }}").rfind("test.jinja:1:", 0), 0u);
  EXPECT_NE(error_of("{{ " + deep + " }}").find("nests deeper than"), std::string::npos);
  // Nested loops over large ranges stop at the step budget instead of running for hours.
  std::string slow =
      "{% for a in range(100000) %}{% for b in range(100000) %}{{ b }}"
      "{% endfor %}{% endfor %}";
  std::string err = error_of(slow);
  EXPECT_TRUE(err.find("exceeded") != std::string::npos ||
              err.find("output larger") != std::string::npos)
      << err;
  EXPECT_NE(error_of("{% set s = namespace(v='ab') %}{% for i in range(64) %}"
                     "{% set s.v = s.v + s.v %}{% endfor %}")
                .find("value larger than"),
            std::string::npos);
}

}  // namespace
}  // namespace sluice
