// The character tokenizer, UTF-8 helpers and the tokenizer record of a token directory (DIR/castor_tokens.json).
#include "castor/tokenizer.h"

#include <algorithm>
#include <bit>

#include "castor/check.h"
#include "castor/fs.h"
#include "text/unicode.h"

namespace castor::data {

CharTokenizer CharTokenizer::from_text(std::string_view text, const std::string& what) {
  std::u32string cps = unicode::decode_utf8(text, what);
  std::sort(cps.begin(), cps.end());
  cps.erase(std::unique(cps.begin(), cps.end()), cps.end());
  CASTOR_CHECK(cps.size() <= 65536, what, ": ", cps.size(),
               " distinct characters, more than 16-bit token ids can number");
  return CharTokenizer(std::vector<char32_t>(cps.begin(), cps.end()));
}

CharTokenizer::CharTokenizer(std::vector<char32_t> chars) : chars_(std::move(chars)) {
  CASTOR_CHECK(chars_.size() <= 65536, "char tokenizer: ", chars_.size(), " characters, more than 65,536");
  for (size_t i = 0; i < chars_.size(); ++i) {
    CASTOR_CHECK(i == 0 || chars_[i - 1] < chars_[i], "char tokenizer: the characters are not sorted and distinct");
    ids_.emplace(chars_[i], static_cast<uint16_t>(i));
  }
}

void CharTokenizer::encode(std::string_view text, std::vector<uint16_t>& out, const std::string& what) const {
  for (char32_t cp : unicode::decode_utf8(text, what)) {
    const auto it = ids_.find(cp);
    CASTOR_CHECK(it != ids_.end(), what, ": character U+", std::hex, static_cast<uint32_t>(cp),
                 " is not in the vocabulary");
    out.push_back(it->second);
  }
}

std::string CharTokenizer::decode(std::span<const uint16_t> tokens) const {
  std::string text;
  for (uint16_t t : tokens) {
    CASTOR_CHECK(t < chars_.size(), "char decode: token ", t, " is outside the vocabulary of ", chars_.size());
    unicode::append_utf8(chars_[t], text);
  }
  return text;
}

std::string CharTokenizer::chars_utf8() const {
  std::string s;
  for (char32_t cp : chars_) unicode::append_utf8(cp, s);
  return s;
}

std::string VocabularyId::describe() const {
  std::string s = kind.empty() ? "" : kind;
  if (size > 0) s += detail::cat(s.empty() ? "" : ", ", size, " tokens");
  if (!checksum.empty()) s += detail::cat(s.empty() ? "" : ", ", "vocab_checksum ", checksum);
  return s.empty() ? "unknown" : s;
}

bool same_vocabulary(const VocabularyId& a, const VocabularyId& b) {
  return (a.kind.empty() || b.kind.empty() || a.kind == b.kind) && (a.size == 0 || b.size == 0 || a.size == b.size) &&
         (a.checksum.empty() || b.checksum.empty() || a.checksum == b.checksum);
}

Tokenizer::Tokenizer(Gpt2Tokenizer gpt2) : kind_("gpt2"), gpt2_(std::make_shared<Gpt2Tokenizer>(std::move(gpt2))) {}
Tokenizer::Tokenizer(CharTokenizer chars) : kind_("char"), chars_(std::make_shared<CharTokenizer>(std::move(chars))) {}
Tokenizer::Tokenizer(BpeTokenizer bpe) : kind_("bpe"), bpe_(std::make_shared<BpeTokenizer>(std::move(bpe))) {}
Tokenizer::Tokenizer(HfTokenizer hf) : kind_("hf"), hf_(std::make_shared<HfTokenizer>(std::move(hf))) {}

bool is_hf_tokenizer_json(const std::string& path) {
  try {
    const std::vector<uint8_t> bytes = read_file(path, /*max_bytes=*/int64_t{1} << 30);
    const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    // A record is small and flat; Hugging Face's file holds a "model" object (parsing 10 MB to find it is avoidable).
    if (text.find("\"model\"") == std::string_view::npos) return false;
    const Json j = Json::parse(text);
    return j.is_object() && j.find("model") && j.at("model").is_object();
  } catch (const Error&) {
    return false;
  }
}

bool is_token_record(const std::string& path) {
  try {
    const std::vector<uint8_t> bytes = read_file(path, /*max_bytes=*/16 << 20);
    const Json j = Json::parse({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
    return j.is_object() && j.find("tokenizer") && j.at("tokenizer").is_string() && !j.find("model");
  } catch (const Error&) {
    return false;
  }
}

std::string token_record_path(const std::string& dir) {
  const std::string record = dir + "/" + kTokenRecord, old = dir + "/tokenizer.json";
  if (file_exists(record)) return record;
  if (file_exists(old) && !is_hf_tokenizer_json(old)) return old;
  return "";
}

Json read_tokenizer_record(const std::string& dir) {
  std::string path = token_record_path(dir);
  if (path.empty()) path = dir + "/" + kTokenRecord;  // read_file names it as missing
  const std::vector<uint8_t> bytes = read_file(path, /*max_bytes=*/16 << 20);
  Json rec;
  try {
    rec = Json::parse({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  } catch (const Error& e) {
    throw Error(detail::cat(path, ": not a tokenizer record: ", e.what()));
  }
  const Json* vocab = rec.is_object() ? rec.find("vocab_size") : nullptr;
  CASTOR_CHECK(vocab && vocab->is_int() && vocab->as_int() >= 1 && vocab->as_int() <= INT32_MAX, path,
               ": vocab_size must be an integer in [1, 2^31), got ", vocab ? vocab->dump() : "none");
  return rec;
}

namespace {

// A bpe record's tokenizer.bin: the recorded file beside the record, with the recorded checksum and piece count.
Tokenizer load_bpe(const std::string& dir, const Json& rec) {
  const std::string& name = rec.at("tokenizer_bin").as_string();
  CASTOR_CHECK(!name.empty() && name.find('/') == std::string::npos, "tokenizer_bin must name a file in ", dir,
               ", got '", printable(name), "'");
  const std::string path = dir + "/" + name;
  const std::vector<uint8_t> bytes = read_file(path, /*max_bytes=*/1 << 30);
  const std::string& sum = rec.at("tokenizer_bin_checksum").as_string();
  CASTOR_CHECK(checksum64_hex(bytes) == sum, path, ": checksum ", checksum64_hex(bytes), ", but ",
               token_record_path(dir), " records ", sum, " (the file was changed or comes from another tokenize)");
  Tokenizer t(BpeTokenizer(parse_tokenizer_bin(bytes, path)));
  const int64_t vocab = rec.at("vocab_size").as_int();
  CASTOR_CHECK(t.vocab_size() == vocab, path, ": ", t.vocab_size(), " pieces, but ", token_record_path(dir),
               " records vocab_size ", vocab);
  return t;
}

}  // namespace

int64_t Tokenizer::recorded_vocab_size(const std::string& dir) {
  return read_tokenizer_record(dir).at("vocab_size").as_int();
}

bool Tokenizer::is_loadable(const std::string& dir) {
  return !token_record_path(dir).empty() || is_hf_tokenizer_json(dir + "/tokenizer.json") ||
         file_exists(dir + "/tokenizer.bin");
}

Tokenizer Tokenizer::load(const std::string& dir) {
  const std::string hf_json = dir + "/tokenizer.json", bin = dir + "/tokenizer.bin";
  if (token_record_path(dir).empty() && is_hf_tokenizer_json(hf_json)) return from_hf_json(hf_json);
  // llama2.c's tokenizer.bin alone (beside a model.bin, as run.c reads it)
  if (token_record_path(dir).empty() && file_exists(bin)) return Tokenizer(BpeTokenizer(read_tokenizer_bin(bin)));
  const std::string path = token_record_path(dir).empty() ? dir + "/" + kTokenRecord : token_record_path(dir);
  const Json rec = read_tokenizer_record(dir);
  Tokenizer t = load_recorded(dir, path, rec);
  const Json* sum = rec.find("vocab_checksum");
  CASTOR_CHECK(!sum || (sum->is_string() && sum->as_string() == t.vocab_checksum()), path, ": vocab_checksum ",
               sum ? sum->dump() : "", ", but the vocabulary in ", dir, " has ", t.vocab_checksum(),
               " (its files were changed or come from another tokenize)");
  return t;
}

Tokenizer Tokenizer::load_recorded(const std::string& dir, const std::string& path, const Json& rec) {
  try {
    const std::string& kind = rec.at("tokenizer").as_string();
    const int64_t vocab = rec.at("vocab_size").as_int();
    if (kind == "gpt2") {
      Tokenizer t(Gpt2Tokenizer::from_dir(dir));
      CASTOR_CHECK(t.vocab_size() == vocab, "vocab_size ", vocab, " but encoder.json has ", t.vocab_size());
      return t;
    }
    if (kind == "bpe") return load_bpe(dir, rec);
    if (kind == "hf") {
      const std::string& name = rec.at("tokenizer_json").as_string();
      CASTOR_CHECK(!name.empty() && name.find('/') == std::string::npos, "tokenizer_json must name a file in ", dir,
                   ", got '", printable(name), "'");
      Tokenizer t = from_hf_json(dir + "/" + name);
      const std::string& sum = rec.at("tokenizer_json_checksum").as_string();
      CASTOR_CHECK(t.hf_checksum_ == sum, dir, "/", name, ": checksum ", t.hf_checksum_, ", but ", path, " records ",
                   sum, " (the file was changed or comes from another tokenize)");
      CASTOR_CHECK(t.vocab_size() == vocab, "vocab_size ", vocab, " but ", dir, "/", name, " has ", t.vocab_size());
      return t;
    }
    CASTOR_CHECK(kind == "char", "unknown tokenizer '", kind, "' (expected gpt2, char, bpe or hf)");
    const std::string& chars = rec.at("chars").as_string();
    const std::u32string cps = unicode::decode_utf8(chars, "chars");
    Tokenizer t(CharTokenizer(std::vector<char32_t>(cps.begin(), cps.end())));
    CASTOR_CHECK(t.vocab_size() == vocab, "vocab_size ", vocab, " but chars holds ", t.vocab_size());
    return t;
  } catch (const Error& e) {
    const std::string msg = e.what();
    throw Error(msg.starts_with(dir) ? msg : path + ": " + msg);
  }
}

Tokenizer Tokenizer::from_hf_json(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path, /*max_bytes=*/int64_t{1} << 30);
  Tokenizer t(HfTokenizer({reinterpret_cast<const char*>(bytes.data()), bytes.size()}, path));
  t.hf_path_ = path;
  t.hf_checksum_ = checksum64_hex(bytes);
  return t;
}

const std::string& Tokenizer::vocab_checksum() const {
  if (!vocab_checksum_->empty()) return *vocab_checksum_;
  std::string content = "castor-vocab-1\n" + kind_ + "\n";
  if (chars_)
    for (char32_t cp : chars_->chars()) content += detail::cat(static_cast<uint32_t>(cp), "\n");
  if (bpe_) {
    const BpeVocabulary& v = bpe_->vocabulary();
    for (int64_t i = 0; i < v.size(); ++i)
      content += detail::cat(v.pieces[i].size(), ":", v.pieces[i], " ", std::bit_cast<uint32_t>(v.scores[i]), "\n");
  }
  if (gpt2_) content += gpt2_->content();
  if (hf_) {
    const std::vector<uint8_t> bytes = read_file(hf_path_, int64_t{1} << 30);
    content += Json::parse({reinterpret_cast<const char*>(bytes.data()), bytes.size()}).dump();
  }
  *vocab_checksum_ = checksum64_hex({reinterpret_cast<const uint8_t*>(content.data()), content.size()});
  return *vocab_checksum_;
}

VocabularyId folder_vocabulary(const std::string& dir) {
  const std::string record = token_record_path(dir);
  if (record.empty()) return Tokenizer::is_loadable(dir) ? Tokenizer::load(dir).vocabulary_id() : VocabularyId{};
  const Json rec = read_tokenizer_record(dir);
  VocabularyId id;
  if (const Json* k = rec.find("tokenizer"); k && k->is_string()) id.kind = k->as_string();
  id.size = rec.at("vocab_size").as_int();
  if (const Json* sum = rec.find("vocab_checksum"); sum && sum->is_string()) {
    id.checksum = sum->as_string();
  } else {
    try {  // (a folder of an older build: its files' vocabulary, when they load)
      id.checksum = Tokenizer::load(dir).vocab_checksum();
    } catch (const Error&) {
    }
  }
  return id;
}

int64_t Tokenizer::vocab_size() const {
  return gpt2_ ? gpt2_->vocab_size() : bpe_ ? bpe_->vocab_size() : hf_ ? hf_->vocab_size() : chars_->vocab_size();
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool add_special) {
  if (hf_) return hf_->encode(text, add_special);
  std::vector<uint16_t> ids;
  if (gpt2_) ids = gpt2_->encode(text);
  if (bpe_) ids = bpe_->encode(text, /*bos=*/add_special, /*eos=*/false);
  if (chars_) chars_->encode(text, ids);
  return {ids.begin(), ids.end()};
}

namespace {

// 32-bit ids as the 16-bit ones the smaller tokenizers take; castor::Error on one past 65,535.
std::vector<uint16_t> narrow(std::span<const uint32_t> ids, int64_t vocab) {
  std::vector<uint16_t> out;
  out.reserve(ids.size());
  for (uint32_t id : ids) {
    CASTOR_CHECK(id <= 0xFFFF, "decode: token ", id, " is outside the vocabulary of ", vocab);
    out.push_back(static_cast<uint16_t>(id));
  }
  return out;
}

}  // namespace

std::string Tokenizer::decode(std::span<const uint32_t> tokens) const {
  if (hf_) return hf_->decode(tokens);
  const std::vector<uint16_t> ids = narrow(tokens, vocab_size());
  return gpt2_ ? gpt2_->decode(ids) : bpe_ ? bpe_->decode(ids) : chars_->decode(ids);
}

std::string Tokenizer::decode_next(int64_t prev, uint32_t token) const {
  if (hf_) return hf_->decode_next(prev, token);
  const uint16_t id = narrow({&token, 1}, vocab_size())[0];
  return bpe_ ? bpe_->decode_piece(static_cast<int32_t>(prev), id) : decode({&token, 1});
}

Tokenizer::Stream::Stream(const Tokenizer& tok, int64_t prev) : tok_(&tok), prev_(prev) {
  if (tok.hf_) hf_.emplace(*tok.hf_, prev);
}

std::string Tokenizer::Stream::next(uint32_t token) {
  if (hf_) return hf_->next(token);
  std::string out = tok_->decode_next(prev_, token);
  prev_ = token;
  return out;
}

std::string Tokenizer::Stream::finish() { return hf_ ? hf_->finish() : ""; }

Json Tokenizer::record() const {
  Json::Object o;
  o["tokenizer"] = kind_;
  o["vocab_size"] = vocab_size();
  o["vocab_checksum"] = vocab_checksum();
  if (gpt2_) o["eot_token"] = static_cast<int64_t>(Gpt2Tokenizer::kEot);
  if (chars_) o["chars"] = chars_->chars_utf8();
  if (bpe_) {
    o["bos_token"] = static_cast<int64_t>(BpeVocabulary::kBos);
    o["eos_token"] = static_cast<int64_t>(BpeVocabulary::kEos);
    o["tokenizer_bin"] = "tokenizer.bin";
    o["tokenizer_bin_checksum"] = checksum64_hex(tokenizer_bin_bytes(bpe_->vocabulary()));
  }
  if (hf_) {
    o["tokenizer_json"] = "tokenizer.json";
    o["tokenizer_json_checksum"] = hf_checksum_;
  }
  return o;
}

}  // namespace castor::data
