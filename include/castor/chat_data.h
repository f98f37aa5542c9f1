// Chat and instruction data for fine-tuning: JSONL rows (conversations, prompt/completion pairs, Alpaca records or
// plain text) rendered with the model's chat template, tokenized with a per-token loss mask, and cut, padded or
// packed into rows of a fixed length (`castor tokenize --format`, docs/fine-tuning.md).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "castor/jinja.h"
#include "castor/json.h"

namespace castor::data {

class Tokenizer;

enum class ChatFormat { Chat, PromptCompletion, Alpaca, Text };
// "chat", "prompt-completion", "alpaca" or "text"; castor::Error naming --format otherwise.
ChatFormat parse_chat_format(const std::string& name);
const char* chat_format_name(ChatFormat f);

// What the chat path needs of a tokenizer: plain-text encoding, the bytes each token stands for (to place tokens in
// the rendered text), the special tokens matched in rendered text, and the template with its variables.
struct ChatTokenizer {
  std::function<void(std::string_view, std::vector<int32_t>&)> encode;  // text without special tokens
  std::function<int64_t(int32_t)> token_bytes;  // the bytes of text a token covers (a dummy prefix space included)
  std::vector<std::pair<std::string, int32_t>> special;  // strings that are one token each wherever they occur
  std::string bos_token, eos_token;                      // as the template sees them
  std::string eot_token;  // what ends an assistant turn in the template (Llama 3's <|eot_id|>; often eos_token)
  int32_t eos_id = -1, eot_id = -1, pad_id = -1;
  bool bos_before_text = false;  // prompt-completion, alpaca and text rows start with bos_token
  std::string chat_template;     // the template's source and its name in errors
  std::string template_what;
};

// Castor's own tokenizers (a token directory's gpt2 or bpe): ChatML with the tokenizer's end-of-text token as
// <|im_end|> (kChatMl), <|endoftext|> (gpt2) or <s> and </s> (bpe) as the special tokens.
// A Hugging Face tokenizer.json (kind hf): the files beside it (a model directory, or a token directory castor
// tokenize made from one): the template of chat_template.jinja, else tokenizer_config.json's chat_template (a string,
// or the "default" of a list); bos_token, eos_token and pad_token from tokenizer_config.json (strings or
// {"content": ...}); the added tokens marked special as the special strings; the end of turn the first special token
// the template writes after an assistant message (else eos_token); bos_before_text when the post-processor puts a
// token first. castor::Error naming the file when `need_template` and there is no template, or a token of the config
// is not in the vocabulary. `template_file` (--chat-template): a template file used in place of the tokenizer's.
extern const char* const kChatMl;
ChatTokenizer chat_tokenizer(const Tokenizer& tokenizer, bool need_template = true,
                             const std::string& template_file = "");

// A conversation rendered (add_generation_prompt false) and the byte ranges of the text that are loss targets: each
// assistant turn from the end of the text the template renders before it with add_generation_prompt (which must be
// a prefix of the whole) to its end-of-turn token, inclusive (or everything with `train_on_prompt`).
struct RenderedText {
  std::string text;
  std::vector<std::pair<size_t, size_t>> targets;  // [begin, end) byte ranges, in order
};
// castor::Error naming `where` (FILE: line N) for a message without a string role and content, a template error, a
// turn the template renders differently when later turns follow, or an assistant turn without its end-of-turn token.
RenderedText render_conversation(const Json& messages, const ChatTemplate& tmpl, const ChatTokenizer& tok,
                                 bool train_on_prompt, const std::string& where);
// The template's text for `messages` with add_generation_prompt (what sampling continues).
std::string render_prompt(const Json& messages, const ChatTemplate& tmpl, const ChatTokenizer& tok);

struct TokenizedText {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;  // 1: a target (predicted from the tokens before it)
};
// The text's tokens: special-token strings as their ids (leftmost, longest first), the text between them encoded
// whole; a token is a target when its first byte lies in a target range.
TokenizedText tokenize_rendered(const RenderedText& r, const ChatTokenizer& tok);

// One JSONL row of `format` rendered and tokenized (chat: {"messages": [{"role", "content"}...]}, or ShareGPT's
// {"conversations": [{"from", "value"}...]} with from human/user/input, gpt/assistant/output or system). castor::Error naming `where` on a row without its fields, an
// empty completion or text, or what render_conversation refuses.
TokenizedText tokenize_row(const Json& row, ChatFormat format, const ChatTemplate& tmpl, const ChatTokenizer& tok,
                           bool train_on_prompt, const std::string& where);

// Examples in rows of `row_tokens`: longer ones cut to it (`truncated`) or left out (`drop_long`, `dropped`); each
// in a row of its own padded with pad_id (mask 0), or with `pack` several to a row by best-fit decreasing (longest
// first into the fullest row it fits, as TRL's packing_strategy "bfd"; a row's examples attend to each other).
struct Rows {
  std::vector<int32_t> ids;  // rows * row_tokens
  std::vector<uint8_t> mask;
  int64_t rows = 0, truncated = 0, dropped = 0, targets = 0;
};
Rows make_rows(const std::vector<TokenizedText>& examples, int64_t row_tokens, bool drop_long, bool pack,
               int32_t pad_id);

}  // namespace castor::data
