// Chat templates: the subset of Jinja that Hugging Face models' chat_template strings use, rendered as transformers
// renders them (trim_blocks, lstrip_blocks, one trailing newline dropped).
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "castor/json.h"

namespace castor::data {

// The interpreter's limits, each a castor::Error naming the template, the line and the limit when a template passes
// it: statements and expressions nested deeper than kMaxTemplateDepth (the tree is walked recursively; also the lists
// and dicts a template builds, as JSON's kMaxDepth); a render of more than kTemplateStepBudget steps (a step: an
// expression evaluated, a statement run, a list element or dict entry made, ten for each loop iteration's `loop`, 256
// bytes of a string copied); text (the output, or a string the template builds) longer than kMaxTemplateText bytes.
// Integers are 64-bit: a result or literal beyond them (where Python's integers grow) is an error.
inline constexpr int kMaxTemplateDepth = Json::kMaxDepth;
inline constexpr int64_t kTemplateStepBudget = int64_t{1} << 20;
inline constexpr size_t kMaxTemplateText = size_t{32} << 20;

// A parsed template. Supported: {{ }}, {# #}, whitespace control (-), {% set %} (also `ns.attr`), {% for x in ... %}
// (also `for k, v in d.items()`, an `if` filter and {% else %}; loop.index/index0/revindex/revindex0/first/last/
// length/previtem/nextitem), {% if/elif/else %}, {% generation %} (transparent, as transformers' markers); literals
// (strings, numbers, true/false/none, lists, dicts), attribute and item access, slicing ([a:b:c], [::-1]), the
// operators and tests real templates use, the filters trim, tojson, length/count, lower, upper, title, capitalize,
// first, last, join, default/d, string, int, float, list, items, replace, safe, abs, map(attribute=),
// selectattr/rejectattr, string methods (strip, lstrip, rstrip, split, startswith, endswith, upper, lower, replace,
// title, capitalize, find, count), dict methods (items, keys, values, get) and the globals namespace(),
// raise_exception() and range(). Anything else is a one-line castor::Error naming the construct and its line.
// A name that neither the template nor the context defines is an error when used (Jinja's StrictUndefined); a
// missing key or attribute of a value is undefined (false, empty when printed, an error in arithmetic), as in
// transformers.
class ChatTemplate {
 public:
  // `what` names the template in errors ("MODEL/tokenizer_config.json's chat_template").
  ChatTemplate(std::string_view source, std::string what);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with the variables of `context` (a JSON object: messages, add_generation_prompt, bos_token, ...).
  // raise_exception(msg) in the template is a castor::Error "WHAT: the template raised: msg".
  std::string render(const Json& context) const;
  const std::string& what() const;

  struct Program;

 private:
  std::unique_ptr<Program> program_;
};

}  // namespace castor::data
