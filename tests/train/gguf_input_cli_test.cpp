// GGUF files as inputs of the castor binary, from the file alone (no --model, no tokenizer directory): a Q4_K_M file
// written by tests/oracle/gguf_writer.py (ggml's own quantizer) and an f32 file of the same values. castor tokenize
// --vocab FILE.gguf gives the ids Castor's library and llama.cpp (node-llama-cpp) give with the file's tokenizer; castor sample --chat takes the
// file's chat template (the same reply as with that template given by --chat-template; a file without one is a
// one-line error); castor eval FILE.gguf --text on the quantized file's blocks gives the f32 file's perplexity; a LoRA
// run on the quantized file trains with its blocks, and a full run says it dequantizes them; castor eval --data and a
// PEFT adapter (eval|sample --lora) on the quantized file keep its blocks and give the f32 file's loss. A
// SentencePiece vocabulary whose merges llama.cpp makes by score alone (halves that are no tokens, equal scores)
// tokenizes as llama.cpp does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "castor/allocator.h"
#include "castor/fs.h"
#include "castor/gguf.h"
#include "castor/json.h"
#include "castor/lora.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"
#include "castor/trainer.h"
#include "test_util.h"
#include "train/loaded_model.h"
#include "train/run_test_util.h"

namespace castor::train {
namespace {

using test::CastorProcess;

const char* kTemplate =
    "{% for message in messages %}{{ \"<s>\" + message[\"content\"] + \"</s>\" }}{% endfor %}"
    "{% if add_generation_prompt %}{{ \"<s>\" }}{% endif %}";

class GgufInputCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new test::ScratchDir("gguf_input_cli");
    const std::string hf = at("hf");
    const std::string config =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 256, \"intermediate_size\": 512, "
        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300, "
        "\"rms_norm_eps\": 1e-6, \"rope_theta\": 5000.0, \"max_position_embeddings\": 64, "
        "\"tie_word_embeddings\": false, \"torch_dtype\": \"float32\", \"bos_token_id\": 1, \"eos_token_id\": 2, "
        "\"seed\": 46}";
    ok_ = test::run_oracle("hf_llama_oracle.py", {"write", hf, config}) &&
          test::run_oracle("gguf_writer.py", {"write", hf, at("q4km.gguf"), "q4_k_m", kTemplate}) &&
          test::run_oracle("gguf_writer.py", {"write", hf, at("f32.gguf"), "f32"});  // (hf: the q4_k_m values)
    std::string text;
    for (int i = 0; i < 40; ++i) text += "a b c aa bb cc abc cab\n";
    atomic_write_file(at("text.txt"), text);
  }
  static void TearDownTestSuite() {
    delete scratch_;
    scratch_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(ok_) << "the oracle could not write the GGUF files"; }
  static std::string at(const std::string& name) { return *scratch_ + "/" + name; }
  static CastorProcess castor(const std::vector<std::string>& args) {
    return test::run_castor(args, test::CastorRun{*scratch_});
  }
  // llama.cpp's own tokenization of `text` with `file`'s tokenizer (node-llama-cpp; no BOS added there).
  static std::vector<uint32_t> llama_cpp_tokens(const std::string& file, const std::string& text) {
    const std::string modules = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm-llama-cpp/node_modules";
    EXPECT_TRUE(file_exists(modules + "/node-llama-cpp/package.json")) << modules << ": run scripts/setup_tests.sh";
    const Json request = Json::Array{Json::Object{
        {"model", at(file)}, {"context", 64}, {"prompt", Json::Array{1}}, {"steps", 0}, {"texts", Json::Array{text}}}};
    atomic_write_file(at("request.json"), request.dump());
    const std::string cmd = "node " + std::string(CASTOR_SOURCE_DIR) + "/tests/oracle/gguf_llama_cpp.mjs " + modules +
                            " " + at("request.json") + " > " + at("llama_cpp.json");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const std::vector<uint8_t> out = read_file(at("llama_cpp.json"));
    const Json reply = Json::parse(std::string(out.begin(), out.end()));  // (held: the loop reads into it)
    std::vector<uint32_t> theirs;
    for (const Json& t : reply.as_array().at(0).at("tokens").as_array().at(0).as_array())
      theirs.push_back(static_cast<uint32_t>(t.as_int()));
    return theirs;
  }
  // castor tokenize --vocab FILE of text.txt into the folder `out`.
  static void tokenize(const std::string& file, const std::string& out) {
    CastorProcess p = castor(
        {"tokenize", "--vocab", file, "--input", "text.txt", "--out", out, "--val-fraction", "0.1"});
    ASSERT_EQ(p.exit_code, 0) << p.err;
  }
  static test::ScratchDir* scratch_;
  static bool ok_;
};
test::ScratchDir* GgufInputCli::scratch_ = nullptr;
bool GgufInputCli::ok_ = false;

TEST_F(GgufInputCli, TokenizeVocabGivesTheFilesTokenizersIds) {
  CastorProcess p = castor(
      {"tokenize", "--vocab", "q4km.gguf", "--input", "text.txt", "--out", "tok", "--val-fraction", "0.1"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  data::Tokenizer tok = data::Tokenizer::load(formats::gguf_tokenizer_dir(at("q4km.gguf")));
  const std::vector<uint8_t> bytes = read_file(at("text.txt"));
  const std::vector<uint32_t> want = tok.encode(std::string(bytes.begin(), bytes.end()));
  ASSERT_GT(want.size(), 100u);
  // (the folder's one document: its ids, the last tenth the validation split's)
  std::vector<uint32_t> got;
  for (const char* split : {"tok/train.bin", "tok/val.bin"}) {
    const data::TokenFile f(at(split));
    for (int64_t i = 0; i < f.size(); ++i) got.push_back(f[i]);
  }
  EXPECT_EQ(got, want);
  const std::vector<uint32_t> theirs = llama_cpp_tokens("q4km.gguf", std::string(bytes.begin(), bytes.end()));
  ASSERT_EQ(want.front(), 1u);  // (the file's add_bos_token)
  EXPECT_EQ(theirs, std::vector<uint32_t>(want.begin() + 1, want.end()));
}

// A SentencePiece vocabulary where llama.cpp's merging (the adjacent pair whose concatenation is a token of the highest
// score, the leftmost of equal scores) differs from merges of two tokens ranked by score: "qx" and "▁qx" whose letters
// are no tokens, "bc" and "ab" of one score (bc listed first), "ee..." of a letter that is none. castor tokenize
// --vocab FILE gives llama.cpp's ids.
TEST_F(GgufInputCli, SentencePieceMergesAsLlamaCpp) {
  const std::string m = "\u2581";
  Json::Array tokens{"<unk>", "<s>", "</s>"}, scores{0.0, 0.0, 0.0}, types{2, 3, 3};
  char byte[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(byte, sizeof byte, "<0x%02X>", b);
    tokens.push_back(std::string(byte)), scores.push_back(0.0), types.push_back(6);
  }
  const std::vector<std::pair<std::string, double>> pieces = {
      {m, -1},         {"a", -2},    {"b", -3},      {"c", -4},      {"d", -5},     {"bc", -10},
      {"ab", -10},     {"qx", -6},   {m + "qx", -7}, {m + "a", -8},  {m + "b", -9}, {"cd", -12},
      {m + "ab", -13}, {"bcd", -14}, {m + "c", -15}, {m + "d", -16}, {"ca", -11},   {"da", -11}};
  for (const auto& [piece, score] : pieces) tokens.push_back(piece), scores.push_back(score), types.push_back(1);
  for (int k = 2; tokens.size() < 300; ++k)  // (letters e: no token alone)
    tokens.push_back(std::string(static_cast<size_t>(k), 'e')), scores.push_back(-100.0 - k), types.push_back(1);
  atomic_write_file(at("spm_vocab.json"),
                    Json(Json::Object{{"tokens", tokens}, {"scores", scores}, {"types", types}}).dump());
  ASSERT_TRUE(test::run_oracle("gguf_writer.py", {"write", at("hf"), at("spm.gguf"), "f32", "", at("spm_vocab.json")}));
  const std::string text = "abc bcd qx aqx abcd cab dabc qxqx ee eee eeeee e abcabc bcab dcba\nqx";
  atomic_write_file(at("spm.txt"), text);
  CastorProcess p = castor(
      {"tokenize", "--vocab", "spm.gguf", "--input", "spm.txt", "--out", "spm_tok", "--val-fraction", "0.1"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  std::vector<uint32_t> got;
  for (const char* split : {"spm_tok/train.bin", "spm_tok/val.bin"}) {
    const data::TokenFile f(at(split));
    for (int64_t i = 0; i < f.size(); ++i) got.push_back(f[i]);
  }
  ASSERT_EQ(got.front(), 1u);  // (add_bos_token)
  EXPECT_EQ(std::vector<uint32_t>(got.begin() + 1, got.end()), llama_cpp_tokens("spm.gguf", text));
}

TEST_F(GgufInputCli, SampleChatTakesTheFilesTemplate) {
  const std::vector<std::string> args = {"sample", "--chat",        "--init", "q4km.gguf", "--prompt",
                                         "a b",    "--temperature", "0",      "--tokens",  "6"};
  CastorProcess s = castor(args);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  atomic_write_file(at("template.jinja"), std::string(kTemplate));
  std::vector<std::string> given = args;
  given.insert(given.end(), {"--chat-template", "template.jinja"});
  CastorProcess t = castor(given);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_EQ(s.out, t.out);
  // The f32 file has no template: one line naming what is missing.
  std::vector<std::string> none = args;
  none[3] = "f32.gguf";
  CastorProcess n = castor(none);
  EXPECT_EQ(n.exit_code, 1) << n.err;
  EXPECT_NE(n.err.find("template"), std::string::npos) << n.err;
}

TEST_F(GgufInputCli, EvalTextOnTheBlocksGivesTheDenseFilesPerplexity) {
  CastorProcess q = castor({"eval", "q4km.gguf", "--text", "text.txt", "--ctx", "32"});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  CastorProcess f = castor({"eval", "f32.gguf", "--text", "text.txt", "--ctx", "32"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const Json a = Json::parse(q.out), b = Json::parse(f.out);
  EXPECT_EQ(a.at("tokens"), b.at("tokens"));
  EXPECT_NEAR(a.at("nll").as_double(), b.at("nll").as_double(), 1e-5 * std::abs(b.at("nll").as_double()));
}

// castor eval FILE.gguf --data tokens reads the quantized matrices into the model as their blocks: the float32 memory
// it holds at its peak stays below the dense weights' bytes (the f32 file's run, the control, holds more), and the loss
// is the f32 file's.
TEST_F(GgufInputCli, EvalDataKeepsTheBlocks) {
  tokenize("q4km.gguf", "tok3");
  const auto eval = [&](const char* file, int64_t& peak) {
    const EvalConfig e = parse_eval_flags(
        {at(file), "--data", "tokens", "--data-dir", at("tok3"), "--block-size", "16"});
    const int64_t before = memory_stats().current_by_dtype[static_cast<size_t>(DType::Float32)];
    reset_peak_memory_stats();
    const Json out = run_eval(e);
    peak = memory_stats().peak_by_dtype[static_cast<size_t>(DType::Float32)] - before;
    return out.at("val_loss").as_double();
  };
  int64_t q_peak = 0, f_peak = 0;
  const double q = eval("q4km.gguf", q_peak), f = eval("f32.gguf", f_peak);
  // The Linear weights' values (2 layers of q, k, v, o, gate, up and down, and the output layer), as float32.
  const int64_t dense = 4 * (2 * (256 * 256 * 2 + 128 * 256 * 2 + 512 * 256 * 3) + 300 * 256);
  EXPECT_LT(q_peak, dense / 2);
  EXPECT_GT(f_peak, dense);
  EXPECT_NEAR(q, f, 1e-5 * std::abs(f));
}

// A PEFT adapter of a LoRA run on the quantized file, given to castor eval|sample --lora with that file, and the run
// itself: the adapters sit beside the blocks (every Linear still quantized, none merged) and the perplexity is the
// f32 file's with the adapter merged, and not the file's without it.
TEST_F(GgufInputCli, LoraAdapterOnTheBlocksGivesTheDenseFilesPerplexity) {
  tokenize("q4km.gguf", "tok4");
  CastorProcess l = castor({"train", "--init",       "q4km.gguf", "--data",       "tokens", "--data-dir",
                            "tok4",  "--block-size", "16",        "--batch-size", "2",      "--steps",
                            "3",     "--lr",         "3e-2",      "--amp",        "O0",     "--eval-iters",
                            "1",     "--threads",    "1",         "--lora-rank",  "4",      "--out",
                            "lora4"});
  ASSERT_EQ(l.exit_code, 0) << l.err;
  CastorProcess x = castor({"export", "--format", "peft", "--checkpoint", "lora4", "--out", "peft4"});
  ASSERT_EQ(x.exit_code, 0) << x.err;
  // The file with the PEFT directory, and the run itself (its base the file), as castor sample and eval load them.
  for (const auto& [model, peft] : {std::pair{"q4km.gguf", "peft4"}, std::pair{"lora4", ""}}) {
    const LoadedLm lm = load_language_model(at(model), 0, "", "", *peft ? at(peft) : "");
    const auto linears = nn::all_linear_layers(*lm.model);
    ASSERT_FALSE(linears.empty());
    for (const auto& [name, layer] : linears) {
      EXPECT_TRUE(layer->quantized) << model << " " << name;
      EXPECT_TRUE(layer->lora && !layer->lora->merged()) << model << " " << name;
    }
  }
  const auto nll = [&](const char* file, bool adapter) {
    // (--ctx 16: the run's context, its block size)
    std::vector<std::string> args = {"eval", file, "--text", "text.txt", "--ctx", "16"};
    if (adapter) args.insert(args.end(), {"--lora", "peft4"});
    CastorProcess p = castor(args);
    EXPECT_EQ(p.exit_code, 0) << p.err;
    return p.exit_code == 0 ? Json::parse(p.out).at("nll").as_double() : NAN;
  };
  const double q = nll("q4km.gguf", true), f = nll("f32.gguf", true);
  EXPECT_NEAR(q, f, 1e-5 * std::abs(f));
  EXPECT_NEAR(nll("lora4", false), f, 1e-5 * std::abs(f));
  EXPECT_GT(std::abs(q - nll("q4km.gguf", false)), 1e-4);
}

// A LoRA run on the quantized file: every Linear's weight stays in blocks (castor info of the run counts them as the
// values they hold); a full run from it says on its first lines that it dequantizes them, as castor info says.
TEST_F(GgufInputCli, LoraKeepsTheBlocksAndFullFineTuningSaysItDequantizes) {
  CastorProcess p = castor(
      {"tokenize", "--vocab", "q4km.gguf", "--input", "text.txt", "--out", "tok2", "--val-fraction", "0.1"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::vector<std::string> common = {
      "train", "--init",  "q4km.gguf", "--data", "tokens", "--data-dir",   "tok2", "--block-size", "16", "--batch-size",
      "2",     "--steps", "2",         "--amp",  "O0",     "--eval-iters", "1",    "--threads",    "1"};
  std::vector<std::string> lora = common;
  lora.insert(lora.end(), {"--lora-rank", "4", "--out", "lora"});
  CastorProcess l = castor(lora);
  ASSERT_EQ(l.exit_code, 0) << l.err;
  EXPECT_TRUE(std::isfinite(Json::parse(l.out).at("val_loss").as_double()));
  EXPECT_EQ(l.err.find("dequantized"), std::string::npos) << l.err;
  std::vector<std::string> full = common;
  full.insert(full.end(), {"--out", "full"});
  CastorProcess r = castor(full);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("q4_K (13 tensors), q6_K (3 tensors)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(this run: dequantized)"), std::string::npos) << r.err;
  CastorProcess i = castor({"info", "q4km.gguf"});
  ASSERT_EQ(i.exit_code, 0) << i.err;
  EXPECT_NE(i.out.find("full fine-tuning dequantizes them"), std::string::npos) << i.out;
}

}  // namespace
}  // namespace castor::train
