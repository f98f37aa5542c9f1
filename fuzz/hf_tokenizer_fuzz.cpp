// libFuzzer target: Hugging Face tokenizer.json files: the input is a tokenizer.json; one that loads encodes a mixed
// text (words, digits, accents, emoji, an unknown script, special-token look-alikes) to ids that are all in its
// vocabulary, which decode without error, token by token as whole (without special tokens, which stream as nothing).
#include <cstdlib>
#include <optional>

#include "castor/check.h"
#include "castor/hf_tokenizer.h"

// A broken invariant: abort, which libFuzzer reports as a crash with the input.
static void require(bool ok) {
  if (!ok) std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  std::optional<castor::data::HfTokenizer> tok;
  try {
    tok.emplace(json, "fuzz.json");
  } catch (const castor::Error&) {
    return 0;
  }
  const castor::data::HfTokenizer::Layout layout = tok->layout();
  for (const bool add_special : {false, true}) {
    const std::vector<uint32_t> ids = tok->encode("Hello wörld  123456 ☃👍 ⠁⠃ <s></s><|endoftext|>\n\tab  ",
                                                  add_special);
    for (uint32_t id : ids) require(id < layout.kind.size() && layout.kind[id] != 0);
    const std::string text = tok->decode(ids);
    // Streamed, the same text (a special token streams as nothing: compared without one).
    castor::data::HfTokenizer::Stream stream(*tok);
    std::string streamed;
    bool special = false;
    for (uint32_t id : ids) streamed += stream.next(id), special |= tok->is_special(id);
    streamed += stream.finish();
    require(special || streamed == text);
  }
  return 0;
}
