// libFuzzer target: the chat-template interpreter: the input is a template, parsed and rendered over a short
// conversation; an error is a castor::Error, never a crash, a hang or a runaway allocation (its depth, step and text
// limits), and what renders is valid UTF-8 within the text limit.
#include <cstdlib>

#include "castor/check.h"
#include "castor/jinja.h"
#include "castor/json.h"

// A broken invariant: abort, which libFuzzer reports as a crash with the input.
static void require(bool ok) {
  if (!ok) std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const castor::Json context = castor::Json::parse(R"({"messages": [
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, wörld 👍"},
      {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "tools": null, "documents": null})");
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  try {
    const castor::data::ChatTemplate tmpl(source, "fuzz.jinja");
    const std::string out = tmpl.render(context);
    require(out.size() <= castor::data::kMaxTemplateText && castor::is_valid_utf8(out));
  } catch (const castor::Error&) {
  }
  return 0;
}
