// GGUF files as inputs of the castor binary, from the file alone (no --model, no tokenizer directory): a Q4_K_M file
// written by tests/oracle/gguf_writer.py (ggml's own quantizer) and an f32 file of the same values. castor tokenize
// --vocab FILE.gguf gives the ids Castor's library and llama.cpp (node-llama-cpp) give with the file's tokenizer; castor sample --chat takes the
// file's chat template (the same reply as with that template given by --chat-template; a file without one is a
// one-line error); castor eval FILE.gguf --text on the quantized file's blocks gives the f32 file's perplexity; a LoRA
// run on the quantized file trains with its blocks, and a full run says it dequantizes them.
#include <gtest/gtest.h>

#include <cmath>

#include "castor/fs.h"
#include "castor/gguf.h"
#include "castor/json.h"
#include "castor/token_file.h"
#include "castor/tokenizer.h"
#include "test_util.h"
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
  // llama.cpp's own tokenization of the text from the file (node-llama-cpp; no BOS added there).
  const std::string modules = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm-llama-cpp/node_modules";
  ASSERT_TRUE(file_exists(modules + "/node-llama-cpp/package.json")) << modules << ": run scripts/setup_tests.sh";
  const Json request = Json::Array{Json::Object{{"model", at("q4km.gguf")},
                                                {"context", 64},
                                                {"prompt", Json::Array{1}},
                                                {"steps", 0},
                                                {"texts", Json::Array{std::string(bytes.begin(), bytes.end())}}}};
  atomic_write_file(at("request.json"), request.dump());
  const std::string cmd = "node " + std::string(CASTOR_SOURCE_DIR) + "/tests/oracle/gguf_llama_cpp.mjs " + modules +
                          " " + at("request.json") + " > " + at("llama_cpp.json");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::vector<uint8_t> out = read_file(at("llama_cpp.json"));
  const Json reply = Json::parse(std::string(out.begin(), out.end()));  // (held: the loop reads into it)
  std::vector<uint32_t> theirs;
  for (const Json& t : reply.as_array().at(0).at("tokens").as_array().at(0).as_array())
    theirs.push_back(static_cast<uint32_t>(t.as_int()));
  ASSERT_EQ(want.front(), 1u);  // (the file's add_bos_token)
  EXPECT_EQ(theirs, std::vector<uint32_t>(want.begin() + 1, want.end()));
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
