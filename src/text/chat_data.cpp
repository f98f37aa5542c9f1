// Chat and instruction data (castor/chat_data.h): rendering with the chat template, target ranges, tokenizing with a
// loss mask, and rows (truncation, padding, best-fit-decreasing packing).
#include "castor/chat_data.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/tokenizer.h"

namespace castor::data {

ChatFormat parse_chat_format(const std::string& name) {
  if (name == "chat") return ChatFormat::Chat;
  if (name == "prompt-completion") return ChatFormat::PromptCompletion;
  if (name == "alpaca") return ChatFormat::Alpaca;
  CASTOR_CHECK(name == "text", "--format: expected chat|prompt-completion|alpaca|text, got '", name, "'");
  return ChatFormat::Text;
}

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::Chat: return "chat";
    case ChatFormat::PromptCompletion: return "prompt-completion";
    case ChatFormat::Alpaca: return "alpaca";
    case ChatFormat::Text: return "text";
  }
  return "?";
}

const char* const kChatMl =
    "{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "eos_token + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

namespace {

Json context(const Json& messages, bool add_generation_prompt, const ChatTokenizer& tok);

std::string file_text(const std::string& path) {
  const std::vector<uint8_t> b = read_file(path, int64_t{1} << 26);
  return {b.begin(), b.end()};
}

// A token of tokenizer_config.json: a string, {"content": string} (an AddedToken) or null ("").
std::string config_token(const Json& config, const char* key, const std::string& what) {
  const Json* v = config.is_object() ? config.find(key) : nullptr;
  if (!v || v->is_null()) return "";
  if (v->is_object()) v = v->find("content");
  CASTOR_CHECK(v && v->is_string(), what, ": ", key, " is neither a string nor {\"content\": string}");
  return v->as_string();
}

// The first special token the template writes after an assistant message's content: the end of its turn.
std::string end_of_turn(const ChatTokenizer& t) {
  const std::string content = "\x01\x02";
  try {
    const ChatTemplate tmpl(t.chat_template, t.template_what);
    const Json messages = Json::Array{Json::Object{{"role", "user"}, {"content", "Hi"}},
                                      Json::Object{{"role", "assistant"}, {"content", content}}};
    const std::string text = tmpl.render(context(messages, false, t));
    const size_t at = text.find(content);
    if (at == std::string::npos) return "";
    size_t best = std::string::npos;
    std::string found;
    for (const auto& [s, id] : t.special)
      if (const size_t p = text.find(s, at + content.size()); p < best || (p == best && s.size() > found.size()))
        best = p, found = s;
    return found;
  } catch (const Error&) {
    return "";  // a template that refuses the probe: the end of turn is eos_token
  }
}

ChatTokenizer hf_chat_tokenizer(const Tokenizer& tokenizer, bool need_template, const std::string& template_file) {
  const HfTokenizer& hf = *tokenizer.hf();
  const std::filesystem::path dir = std::filesystem::path(tokenizer.hf_path()).parent_path();
  const std::string config_path = (dir / "tokenizer_config.json").string();
  const std::string jinja_path = (dir / "chat_template.jinja").string();
  Json config = Json::Object{};
  if (file_exists(config_path)) {
    try {
      config = Json::parse(file_text(config_path));
    } catch (const Error& e) {
      throw Error(detail::cat(config_path, ": ", e.what()));
    }
    CASTOR_CHECK(config.is_object(), config_path, ": expected a JSON object");
  }
  ChatTokenizer t;
  if (!template_file.empty()) {
    t.chat_template = file_text(template_file), t.template_what = template_file;
  } else if (file_exists(jinja_path)) {
    t.chat_template = file_text(jinja_path), t.template_what = jinja_path;
  } else if (const Json* c = config.find("chat_template"); c && !c->is_null()) {
    t.template_what = config_path + "'s chat_template";
    if (c->is_array()) {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
      for (const Json& e : c->as_array())
        if (const Json* n = e.is_object() ? e.find("name") : nullptr;
            n && n->is_string() && n->as_string() == "default")
          c = e.find("template");
      CASTOR_CHECK(c && !c->is_array(), config_path, ": chat_template is a list without a \"default\" template");
    }
    CASTOR_CHECK(c && c->is_string(), config_path, ": chat_template is not a string");
    t.chat_template = c->as_string();
  }
  CASTOR_CHECK(
      !need_template || !t.chat_template.empty(), dir.string(),
      ": no chat template (neither chat_template.jinja nor tokenizer_config.json's chat_template); a base "
      "model's tokenizer: give one with --chat-template FILE, or use --format prompt-completion, alpaca or text");
  const auto id_of = [&](const std::string& token, const char* key) -> int32_t {
    if (token.empty()) return -1;
    const std::optional<uint32_t> id = hf.token_id(token);
    CASTOR_CHECK(id.has_value(), config_path, ": ", key, " '", printable(token), "' is not a token of ",
                 tokenizer.hf_path());
    return static_cast<int32_t>(*id);
  };
  t.bos_token = config_token(config, "bos_token", config_path);
  t.eos_token = config_token(config, "eos_token", config_path);
  t.eos_id = id_of(t.eos_token, "eos_token");
  t.pad_id = id_of(config_token(config, "pad_token", config_path), "pad_token");
  const std::vector<uint32_t>& prefix = hf.prefix_ids();
  t.bos_before_text = !prefix.empty();  // (the post-processor's BOS, which castor tokenize's rows start with)
  const HfTokenizer::Layout layout = hf.layout();
  if (t.bos_before_text && t.bos_token.empty()) t.bos_token = layout.tokens[prefix.front()];
  for (size_t id = 0; id < layout.kind.size(); ++id)
    if (layout.kind[id] == 3) t.special.emplace_back(layout.tokens[id], static_cast<int32_t>(id));
  t.encode = [hf](std::string_view text, std::vector<int32_t>& out) {
    for (uint32_t id : hf.encode(text, false)) out.push_back(static_cast<int32_t>(id));
  };
  // A token's bytes inside a text (after a token that is not special: no leading space stripped).
  t.token_bytes = [hf](int32_t id) -> int64_t {
    const auto u = static_cast<uint32_t>(id);
    return static_cast<int64_t>(hf.decode_next(u, u).size());
  };
  t.eot_token = t.chat_template.empty() ? "" : end_of_turn(t);
  if (t.eot_token.empty()) t.eot_token = t.eos_token;
  t.eot_id = t.eot_token.empty() ? -1 : id_of(t.eot_token, "the end of turn");
  if (t.eos_id < 0) t.eos_id = t.eot_id;
  if (t.pad_id < 0) t.pad_id = t.eos_id;
  CASTOR_CHECK(t.eos_id >= 0, config_path, ": no eos_token (chat data ends a completion with it)");
  return t;
}

}  // namespace

ChatTokenizer chat_tokenizer(const Tokenizer& tokenizer, bool need_template, const std::string& template_file) {
  if (tokenizer.hf()) return hf_chat_tokenizer(tokenizer, need_template, template_file);
  ChatTokenizer t;
  t.chat_template = template_file.empty() ? kChatMl : file_text(template_file);
  t.template_what = template_file.empty() ? "Castor's ChatML template" : template_file;
  t.bos_before_text = true;
  if (const BpeTokenizer* bpe = tokenizer.bpe()) {
    t.encode = [bpe](std::string_view text, std::vector<int32_t>& out) {
      for (uint16_t id : bpe->encode(text, false, false)) out.push_back(id);
    };
    t.token_bytes = [bpe](int32_t id) -> int64_t {
      const std::string& piece = bpe->vocabulary().pieces[static_cast<size_t>(id)];
      return piece.size() == 6 && piece.starts_with("<0x") && piece.back() == '>' ? 1
                                                                                  : static_cast<int64_t>(piece.size());
    };
    t.special = {{"<s>", BpeVocabulary::kBos}, {"</s>", BpeVocabulary::kEos}};
    t.bos_token = "<s>", t.eos_token = t.eot_token = "</s>";
    t.eos_id = t.eot_id = t.pad_id = BpeVocabulary::kEos;
    return t;
  }
  CASTOR_CHECK(tokenizer.kind() == "gpt2", "chat data: a ", tokenizer.kind(),
               " tokenizer has no end-of-text token (use gpt2, bpe or a model's tokenizer)");
  t.encode = [tok = tokenizer](std::string_view text, std::vector<int32_t>& out) mutable {
    for (uint32_t id : tok.encode(text)) out.push_back(static_cast<int32_t>(id));
  };
  t.token_bytes = [tokenizer](int32_t id) -> int64_t {
    const auto u = static_cast<uint32_t>(id);
    return static_cast<int64_t>(tokenizer.decode({&u, 1}).size());
  };
  t.special = {{"<|endoftext|>", Gpt2Tokenizer::kEot}};
  t.bos_token = t.eos_token = t.eot_token = "<|endoftext|>";
  t.eos_id = t.eot_id = t.pad_id = Gpt2Tokenizer::kEot;
  return t;
}

namespace {

Json context(const Json& messages, bool add_generation_prompt, const ChatTokenizer& tok) {
  // The variables transformers' apply_chat_template passes (tools and documents None when not given).
  return Json::Object{{"messages", messages},       {"add_generation_prompt", add_generation_prompt},
                      {"bos_token", tok.bos_token}, {"eos_token", tok.eos_token},
                      {"tools", nullptr},           {"documents", nullptr}};
}

std::string render(const ChatTemplate& tmpl, const Json& messages, bool agp, const ChatTokenizer& tok,
                   const std::string& where) {
  try {
    return tmpl.render(context(messages, agp, tok));
  } catch (const Error& e) {
    throw Error(detail::cat(where, ": ", e.what()));
  }
}

const std::string& string_field(const Json& row, const char* key, const std::string& where, const char* what) {
  const Json* v = row.is_object() ? row.find(key) : nullptr;
  CASTOR_CHECK(v && v->is_string(), where, ": ", what, " has no string \"", key, "\"");
  return v->as_string();
}

// ShareGPT's turns ({"from", "value"}) as messages, the roles mapped as Unsloth's standardize_sharegpt maps them.
Json sharegpt_messages(const Json& conversations, const std::string& where) {
  CASTOR_CHECK(conversations.is_array() && !conversations.as_array().empty(), where,
               ": \"conversations\" must be a non-empty list of {\"from\", \"value\"}");
  static const std::vector<std::pair<std::string, const char*>> kRoles = {
      {"system", "system"}, {"human", "user"},          {"user", "user"},       {"input", "user"},
      {"gpt", "assistant"}, {"assistant", "assistant"}, {"output", "assistant"}};
  Json::Array messages;
  for (size_t i = 0; i < conversations.as_array().size(); ++i) {
    const Json& turn = conversations.as_array()[i];
    const std::string what = detail::cat("turn ", i + 1, " of \"conversations\"");
    const std::string& from = string_field(turn, "from", where, what.c_str());
    const auto role = std::find_if(kRoles.begin(), kRoles.end(), [&](const auto& r) { return r.first == from; });
    CASTOR_CHECK(role != kRoles.end(), where, ": ", what, ": \"from\" is '", printable(from),
                 "' (expected human, gpt or system; also user, assistant, input, output)");
    messages.push_back(
        Json::Object{{"role", role->second}, {"content", string_field(turn, "value", where, what.c_str())}});
  }
  return messages;
}

}  // namespace

std::string render_prompt(const Json& messages, const ChatTemplate& tmpl, const ChatTokenizer& tok) {
  return render(tmpl, messages, true, tok, "the prompt");
}

RenderedText render_conversation(const Json& messages, const ChatTemplate& tmpl, const ChatTokenizer& tok,
                                 bool train_on_prompt, const std::string& where) {
  CASTOR_CHECK(messages.is_array() && !messages.as_array().empty(), where,
               ": \"messages\" must be a non-empty list of {\"role\", \"content\"}");
  const Json::Array& msgs = messages.as_array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string what = detail::cat("message ", i + 1);
    string_field(msgs[i], "role", where, what.c_str());
    string_field(msgs[i], "content", where, what.c_str());
  }
  RenderedText r;
  r.text = render(tmpl, messages, false, tok, where);
  if (train_on_prompt) {
    r.targets.emplace_back(0, r.text.size());
    return r;
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (msgs[i].at("role").as_string() != "assistant") continue;
    const Json before(Json::Array(msgs.begin(), msgs.begin() + static_cast<std::ptrdiff_t>(i)));
    const std::string prompt = render(tmpl, before, true, tok, where);
    CASTOR_CHECK(r.text.starts_with(prompt), where, ": ", tmpl.what(), " renders the turns before message ", i + 1,
                 " (assistant) differently when later turns follow; its loss mask cannot be placed");
    const size_t begin = prompt.size();
    const size_t eot = tok.eot_token.empty() ? std::string::npos : r.text.find(tok.eot_token, begin);
    CASTOR_CHECK(eot != std::string::npos, where, ": ", tmpl.what(), " does not end message ", i + 1,
                 " (assistant) with the end-of-turn token '", tok.eot_token, "'");
    r.targets.emplace_back(begin, eot + tok.eot_token.size());
  }
  return r;
}

TokenizedText tokenize_rendered(const RenderedText& r, const ChatTokenizer& tok) {
  TokenizedText out;
  std::vector<size_t> starts;  // each token's first byte in r.text
  auto encode_text = [&](size_t from, size_t to) {
    if (from == to) return;
    const size_t first = out.ids.size();
    tok.encode(std::string_view(r.text).substr(from, to - from), out.ids);
    int64_t covered = 0;
    for (size_t k = first; k < out.ids.size(); ++k) covered += tok.token_bytes(out.ids[k]);
    // A dummy prefix (sentencepiece's space before a text) covers no byte of the text: offsets start that much later.
    int64_t offset = static_cast<int64_t>(to - from) - covered;
    for (size_t k = first; k < out.ids.size(); ++k) {
      starts.push_back(from + static_cast<size_t>(std::max<int64_t>(0, offset)));
      offset += tok.token_bytes(out.ids[k]);
    }
  };
  size_t pos = 0, plain = 0;
  while (pos < r.text.size()) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& s : tok.special)
      if (r.text.compare(pos, s.first.size(), s.first) == 0 && (!hit || s.first.size() > hit->first.size())) hit = &s;
    if (!hit) {
      ++pos;
      continue;
    }
    encode_text(plain, pos);
    out.ids.push_back(hit->second);
    starts.push_back(pos);
    pos += hit->first.size();
    plain = pos;
  }
  encode_text(plain, r.text.size());
  out.mask.resize(out.ids.size());
  for (size_t k = 0; k < out.ids.size(); ++k)
    for (const auto& [b, e] : r.targets)
      if (starts[k] >= b && starts[k] < e) out.mask[k] = 1;
  return out;
}

TokenizedText tokenize_row(const Json& row, ChatFormat format, const ChatTemplate& tmpl, const ChatTokenizer& tok,
                           bool train_on_prompt, const std::string& where) {
  CASTOR_CHECK(row.is_object(), where, ": expected a JSON object, got a ", row.type_name());
  if (format == ChatFormat::Chat) {
    const Json* messages = row.find("messages");
    if (const Json* conversations = row.find("conversations"); conversations && !messages) {
      const Json converted = sharegpt_messages(*conversations, where);
      return tokenize_rendered(render_conversation(converted, tmpl, tok, train_on_prompt, where), tok);
    }
    CASTOR_CHECK(messages, where, ": no \"messages\" (nor ShareGPT's \"conversations\"; --format chat)");
    return tokenize_rendered(render_conversation(*messages, tmpl, tok, train_on_prompt, where), tok);
  }
  std::string prompt, completion;
  if (format == ChatFormat::PromptCompletion) {
    prompt = string_field(row, "prompt", where, "the row");
    completion = string_field(row, "completion", where, "the row");
    CASTOR_CHECK(!completion.empty(), where, ": empty \"completion\"");
  } else if (format == ChatFormat::Alpaca) {
    // Stanford Alpaca's PROMPT_DICT (train.py), with torchtune's and Unsloth's newline after "### Response:".
    const std::string& instruction = string_field(row, "instruction", where, "the row");
    const Json* input = row.find("input");
    CASTOR_CHECK(!input || input->is_string(), where, ": \"input\" must be a string");
    completion = string_field(row, "output", where, "the row");
    CASTOR_CHECK(!completion.empty(), where, ": empty \"output\"");
    const bool with_input = input && !input->as_string().empty();
    prompt = with_input ? "Below is an instruction that describes a task, paired with an input that provides further "
                          "context. Write a response that appropriately completes the request.\n\n### Instruction:\n" +
                              instruction + "\n\n### Input:\n" + input->as_string() + "\n\n### Response:\n"
                        : "Below is an instruction that describes a task. Write a response that appropriately "
                          "completes the request.\n\n### Instruction:\n" +
                              instruction + "\n\n### Response:\n";
  } else {
    completion = string_field(row, "text", where, "the row");
    CASTOR_CHECK(!completion.empty(), where, ": empty \"text\"");
  }
  RenderedText r;
  const std::string bos = tok.bos_before_text ? tok.bos_token : "";
  r.text = bos + prompt + completion + tok.eos_token;
  r.targets.emplace_back(train_on_prompt || format == ChatFormat::Text ? 0 : bos.size() + prompt.size(), r.text.size());
  return tokenize_rendered(r, tok);
}

Rows make_rows(const std::vector<TokenizedText>& examples, int64_t row_tokens, bool drop_long, bool pack,
               int32_t pad_id) {
  CASTOR_CHECK(row_tokens >= 2, "rows need at least 2 tokens, got ", row_tokens);
  Rows rows;
  std::vector<const TokenizedText*> kept;
  for (const TokenizedText& e : examples) {
    if (static_cast<int64_t>(e.ids.size()) > row_tokens) {
      if (drop_long) {
        ++rows.dropped;
        continue;
      }
      ++rows.truncated;
    }
    if (!e.ids.empty()) kept.push_back(&e);
  }
  auto length = [&](const TokenizedText* e) {
    return std::min<int64_t>(static_cast<int64_t>(e->ids.size()), row_tokens);
  };
  std::vector<std::vector<const TokenizedText*>> bins;
  if (pack) {
    // Best-fit decreasing: longest first (stable), each into the row with the least room that still holds it.
    std::stable_sort(kept.begin(), kept.end(), [&](auto* a, auto* b) { return length(a) > length(b); });
    std::multimap<int64_t, size_t> room;  // free tokens -> row
    for (const TokenizedText* e : kept) {
      auto it = room.lower_bound(length(e));
      size_t bin;
      int64_t free;
      if (it == room.end()) {
        bin = bins.size();
        bins.emplace_back();
        free = row_tokens;
      } else {
        bin = it->second, free = it->first;
        room.erase(it);
      }
      bins[bin].push_back(e);
      room.emplace(free - length(e), bin);
    }
  } else {
    for (const TokenizedText* e : kept) bins.push_back({e});
  }
  for (const auto& bin : bins) {
    int64_t used = 0;
    for (const TokenizedText* e : bin) {
      const int64_t n = length(e);
      // An example's first token is never its target (a row's has nothing before it; a packed one's would be
      // predicted from the example before).
      const size_t first = rows.mask.size();
      rows.ids.insert(rows.ids.end(), e->ids.begin(), e->ids.begin() + n);
      rows.mask.insert(rows.mask.end(), e->mask.begin(), e->mask.begin() + n);
      rows.mask[first] = 0;
      used += n;
    }
    rows.ids.insert(rows.ids.end(), static_cast<size_t>(row_tokens - used), pad_id);
    rows.mask.insert(rows.mask.end(), static_cast<size_t>(row_tokens - used), 0);
  }
  rows.rows = static_cast<int64_t>(bins.size());
  for (uint8_t m : rows.mask) rows.targets += m;
  return rows;
}

}  // namespace castor::data
