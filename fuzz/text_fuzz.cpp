// libFuzzer target: the text-data parsers: token-file headers, the GPT-2 pre-tokenizer, the character tokenizer
// (whose decode must give the text back) and the Brown corpus stripper.
#include <cstdlib>

#include "castor/check.h"
#include "castor/corpus.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"

// A broken invariant: abort, which libFuzzer reports as a crash with the input.
static void require(bool ok) {
  if (!ok) std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    int width = 0;
    castor::data::check_token_file({data, size}, "fuzz", width);
  } catch (const castor::Error&) {
  }
  try {
    size_t covered = 0;
    for (std::string_view piece : castor::data::Gpt2Tokenizer::split(text)) {
      require(!piece.empty() && piece.data() == text.data() + covered);  // the pieces tile the text
      covered += piece.size();
    }
    require(covered == size);
  } catch (const castor::Error&) {
  }
  try {
    const castor::data::CharTokenizer chars = castor::data::CharTokenizer::from_text(text, "fuzz");
    std::vector<uint16_t> ids;
    chars.encode(text, ids);
    require(chars.decode(ids) == text);
  } catch (const castor::Error&) {
  }
  try {
    castor::data::strip_brown(text, "fuzz");
  } catch (const castor::Error&) {
  }
  return 0;
}
