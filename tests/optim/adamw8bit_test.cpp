// 8-bit AdamW against the numpy oracle (tests/oracle/adamw8bit_oracle.py): maps, quantisation, updates, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"
#include "kernels/kernels.h"
#include "oracle_files.h"

namespace castor::optim {
namespace {

using test::bit_equal;
using test::read_oracle_tensor;
using test::ScratchDir;

bool run_8bit_oracle(const std::string& mode, const std::string& json, const ScratchDir& dir) {
  return test::run_oracle("adamw8bit_oracle.py", {mode, json, dir});
}

// The maps equal the oracle's (bitsandbytes' create_dynamic_map computed in double, checked there against
// bitsandbytes' float32 computation): sorted, 256 distinct values each, 0 and 1 among them.
TEST(AdamW8bit, DynamicMapsEqualTheOracle) {
  ScratchDir dir;
  ASSERT_TRUE(run_8bit_oracle("map", "{}", dir));
  for (bool is_signed : {true, false}) {
    const Tensor want = read_oracle_tensor(dir, is_signed ? "map_signed" : "map_unsigned", {256});
    EXPECT_TRUE(bit_equal(from_blob(kernels::dynamic_map(is_signed), {256}, DType::Float32), want)) << is_signed;
  }
}

// Quantisation cases: values, block size, signed map.
struct QuantizeCase {
  std::vector<float> x;
  int64_t block;
  bool is_signed;
  std::string what;
};

// Codes, absmaxes and the dequantised values of every case equal the oracle's (one oracle run for all).
void expect_quantize_equals_oracle(const std::vector<QuantizeCase>& cases) {
  ScratchDir dir;
  std::string json = "[";
  for (size_t k = 0; k < cases.size(); ++k) {
    std::ofstream(dir + "/x_" + std::to_string(k) + ".bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(cases[k].x.data()), static_cast<std::streamsize>(cases[k].x.size() * 4));
    json += detail::cat(k ? ", " : "", "{\"block\": ", cases[k].block,
                        ", \"signed\": ", cases[k].is_signed ? "true" : "false", "}");
  }
  ASSERT_TRUE(run_8bit_oracle("quantize", json + "]", dir));
  for (size_t k = 0; k < cases.size(); ++k) {
    const QuantizeCase& c = cases[k];
    const std::string s = std::to_string(k);
    const int64_t n = static_cast<int64_t>(c.x.size()), blocks = (n + c.block - 1) / c.block;
    Tensor codes = empty({n}, DType::UInt8), absmax = empty({blocks}), back = empty({n});
    kernels::quantize_blockwise(c.x.data(), n, c.block, c.is_signed, codes.data<uint8_t>(), absmax.data<float>());
    kernels::dequantize_blockwise(codes.data<uint8_t>(), absmax.data<float>(), n, c.block, c.is_signed,
                                  back.data<float>());
    SCOPED_TRACE(c.what + (c.is_signed ? ", signed" : ", unsigned"));
    EXPECT_TRUE(bit_equal(codes, read_oracle_tensor(dir, "codes_" + s, {n}, DType::UInt8)));
    EXPECT_TRUE(bit_equal(absmax, read_oracle_tensor(dir, "absmax_" + s, {blocks})));
    EXPECT_TRUE(bit_equal(back, read_oracle_tensor(dir, "dequantized_" + s, {n})));
  }
}

TEST(AdamW8bit, QuantizationRoundTripEqualsTheOracle) {
  Generator gen(5);
  const Tensor r = randn({5000}, DType::Float32, &gen);
  std::vector<float> normal = r.to_vector<float>();
  // Every midpoint and its neighbours: ties go to the lower code.
  std::vector<float> ties;
  for (bool is_signed : {true, false}) {
    const float* map = kernels::dynamic_map(is_signed);
    for (int k = 0; k < 255; ++k) {
      const float mid = (map[k] + map[k + 1]) * 0.5f;
      ties.insert(ties.end(), {mid, std::nextafter(mid, -1.0f), std::nextafter(mid, 2.0f)});
    }
  }
  ties.push_back(1.0f);  // the absmax: every other value is itself
  std::vector<QuantizeCase> cases;
  for (bool is_signed : {true, false}) {
    std::vector<float> x = normal;
    if (!is_signed)
      for (float& v : x) v = v * v;
    // a block not a multiple of the size (5000 = 2 x 2048 + 904), and blocks of 256
    cases.push_back({x, 2048, is_signed, "normal"});
    cases.push_back({x, 256, is_signed, "normal, blocks of 256"});
    std::vector<float> t;
    for (float v : ties)
      if (is_signed || v >= 0) t.push_back(v);
    cases.push_back({t, 1024, is_signed, "midpoints"});
    // zeros; a block of one value; denormals (alone, and beside normal values); tiny negatives keep their sign
    cases.push_back({std::vector<float>(300, 0.0f), 256, is_signed, "zeros"});
    cases.push_back({std::vector<float>(300, 0.37f), 256, is_signed, "one value"});
    std::vector<float> denormals, mixed;
    for (int k = 0; k < 256; ++k) {
      const float d = std::ldexp(static_cast<float>(k + 1), -149);  // 2^-149 .. 2^-141
      denormals.push_back(is_signed && k % 2 ? -d : d);
      mixed.push_back(k == 7 ? 3.0f : k % 3 == 0 ? d : is_signed ? -1e-9f * static_cast<float>(k) : 1e-9f);
    }
    cases.push_back({denormals, 64, is_signed, "denormals"});
    cases.push_back({mixed, 128, is_signed, "denormals and tiny values beside a large one"});
  }
  expect_quantize_equals_oracle(cases);
}

// The AVX-512 lookup finds the nearest code from the binade, one compare and a product, and takes the table only
// within 2^-12 of a midpoint's position: its codes against the oracle's on every 7919th float of [-1, 1], every
// midpoint with the floats up to 40 ulps and at 2^6 .. 2^20 ulps either side (the edges of that band), and the
// binades' ends, each block led by 1 so that its absmax is 1 and x / absmax = x. (A sweep of all 2^31 floats of
// [-1, 1] and NaN gave the same codes as the table's lookup.)
TEST(AdamW8bit, CodesEqualTheOracleNearEveryMidpointAndOnADenseSample) {
  const int64_t block = 2048;
  std::vector<QuantizeCase> cases;
  for (bool is_signed : {true, false}) {
    std::vector<float> values;
    auto add = [&](float v) {
      if (std::fabs(v) <= 1.0f && (is_signed || v >= 0)) values.push_back(v);
    };
    for (uint32_t bits = 0; bits <= 0x3f800000u; bits += 7919) {
      float v;
      std::memcpy(&v, &bits, 4);
      add(v);
      add(-v);
    }
    auto step = [](float v, int64_t ulps) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      bits = v < 0 ? bits - static_cast<uint32_t>(ulps) : bits + static_cast<uint32_t>(ulps);  // toward larger
      std::memcpy(&v, &bits, 4);
      return v;
    };
    const float* map = kernels::dynamic_map(is_signed);
    for (int k = 0; k < 255; ++k) {
      const float mid = (map[k] + map[k + 1]) * 0.5f;
      for (int64_t u = -40; u <= 40; ++u) add(step(mid, u));
      for (int e = 6; e <= 20; ++e)
        for (int64_t u : {int64_t{1} << e, 3 * (int64_t{1} << (e - 1))}) {
          add(step(mid, u));
          add(step(mid, -u));
        }
    }
    for (int e = 0; e <= 30; ++e)
      for (int64_t u = -2; u <= 2; ++u) {
        add(step(std::ldexp(1.0f, -e), u));
        add(-step(std::ldexp(1.0f, -e), u));
      }
    std::vector<float> x;
    for (size_t k = 0; k < values.size(); ++k) {
      if (x.size() % block == 0) x.push_back(1.0f);
      x.push_back(values[k]);
    }
    cases.push_back({x, block, is_signed, "dense sample and midpoints"});
  }
  expect_quantize_equals_oracle(cases);
}

// Steps of AdamW8bit on a 5200-element parameter (blocks of `block`, the last short) and a 7-element one (32-bit
// states, the oracle's torch.optim.AdamW): weights, codes and absmaxes after every step equal the oracle's.
void expect_steps_equal_oracle(int64_t block, double weight_decay) {
  const int steps = 4;
  const int64_t n = 5200, blocks = (n + block - 1) / block;
  const AdamW8bitOptions o{
      .lr = 2e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = weight_decay, .block_size = block};
  ScratchDir dir;
  ASSERT_TRUE(run_8bit_oracle("update",
                              detail::cat("{\"seed\": 3, \"n\": ", n, ", \"small\": 7, \"steps\": ", steps,
                                          ", \"lr\": ", o.lr, ", \"beta1\": ", o.beta1, ", \"beta2\": ", o.beta2,
                                          ", \"eps\": ", o.eps, ", \"weight_decay\": ", o.weight_decay,
                                          ", \"block\": ", block, ", \"grad_scale\": 0.01}"),
                              dir));
  Tensor w = read_oracle_tensor(dir, "init", {40, 130}).requires_grad_();
  Tensor small = read_oracle_tensor(dir, "init_small", {7}).requires_grad_();
  AdamW8bit opt({w, small}, o);
  for (int step = 1; step <= steps; ++step) {
    const std::string s = std::to_string(step);
    w.set_grad(read_oracle_tensor(dir, "grad_" + s, {40, 130}));
    small.set_grad(read_oracle_tensor(dir, "grad_small_" + s, {7}));
    opt.step();
    EXPECT_TRUE(bit_equal(w, read_oracle_tensor(dir, "weight_" + s, {40, 130}))) << "step " << step;
    EXPECT_TRUE(bit_equal(small, read_oracle_tensor(dir, "weight_small_" + s, {7}))) << "step " << step;
    const auto& st = opt.param_groups()[0].slots[0].state;
    for (const char* m : {"exp_avg", "exp_avg_sq"}) {
      EXPECT_TRUE(bit_equal(st.at(std::string(m) + "_code").reshape({n}),
                            read_oracle_tensor(dir, std::string(m) + "_code_" + s, {n}, DType::UInt8)))
          << m << " step " << step;
      EXPECT_TRUE(bit_equal(st.at(std::string(m) + "_absmax"),
                            read_oracle_tensor(dir, std::string(m) + "_absmax_" + s, {blocks})))
          << m << " step " << step;
    }
    EXPECT_EQ(opt.param_groups()[0].slots[1].state.count("exp_avg"), 1u);  // 32-bit states
  }
}

TEST(AdamW8bit, StepsEqualTheOracle) {
  expect_steps_equal_oracle(2048, 0.1);
  expect_steps_equal_oracle(256, 0.0);
  expect_steps_equal_oracle(8192, 0.01);  // one block larger than the parameter
}

// Which parameters keep 8-bit states, the state dict's layout, and a resumed optimizer continuing bit for bit.
TEST(AdamW8bit, StateDictRoundTripResumesBitExact) {
  Generator gen(9);
  const Tensor w0 = randn({64, 80}, DType::Float32, &gen), b0 = randn({5000}, DType::Float32, &gen),
               s0 = randn({10, 10}, DType::Float32, &gen);
  auto grads = [&](int k) {
    Generator g(100 + k);
    return std::vector<Tensor>{randn({64, 80}, DType::Float32, &g), randn({5000}, DType::Float32, &g),
                               randn({10, 10}, DType::Float32, &g)};
  };
  std::vector<Tensor> a = {w0.clone().requires_grad_(), b0.clone().requires_grad_(), s0.clone().requires_grad_()};
  AdamW8bit full(a, {.block_size = 1024});
  StateDict mid;
  for (int k = 0; k < 6; ++k) {
    if (k == 3) mid = full.state_dict();
    const std::vector<Tensor> g = grads(k);
    for (size_t j = 0; j < a.size(); ++j) a[j].set_grad(g[j]);
    full.step();
  }
  // 64 x 80 keeps 8 bits; 5000 elements of one dimension and 10 x 10 keep float32
  EXPECT_EQ(mid.at("state.0.0.exp_avg_code").dtype(), DType::UInt8);
  EXPECT_EQ(mid.at("state.0.0.exp_avg_absmax").shape(), (Shape{5}));
  EXPECT_EQ(mid.count("state.0.0.exp_avg"), 0u);
  EXPECT_EQ(mid.count("state.0.1.exp_avg_code") + mid.count("state.0.2.exp_avg_code"), 0u);
  EXPECT_EQ(mid.at("state.0.1.exp_avg_sq").dtype(), DType::Float32);
  // resume from step 3: the same weights and states as the run that did not stop
  std::vector<Tensor> b;
  {  // the weights at step 3, replayed
    std::vector<Tensor> c = {w0.clone().requires_grad_(), b0.clone().requires_grad_(), s0.clone().requires_grad_()};
    AdamW8bit replay(c, {.block_size = 1024});
    for (int k = 0; k < 3; ++k) {
      const std::vector<Tensor> g = grads(k);
      for (size_t j = 0; j < c.size(); ++j) c[j].set_grad(g[j]);
      replay.step();
    }
    b = {c[0].detach().clone().requires_grad_(), c[1].detach().clone().requires_grad_(),
         c[2].detach().clone().requires_grad_()};
  }
  AdamW8bit resumed(b, {.block_size = 1024});
  resumed.load_state_dict(mid);
  for (int k = 3; k < 6; ++k) {
    const std::vector<Tensor> g = grads(k);
    for (size_t j = 0; j < b.size(); ++j) b[j].set_grad(g[j]);
    resumed.step();
  }
  for (size_t j = 0; j < a.size(); ++j) EXPECT_TRUE(bit_equal(a[j], b[j])) << j;
  const StateDict x = full.state_dict(), y = resumed.state_dict();
  ASSERT_EQ(x.size(), y.size());
  for (const auto& [k, t] : x) EXPECT_TRUE(bit_equal(t, y.at(k))) << k;
}

TEST(AdamW8bit, BadInputIsRefused) {
  Tensor w = randn({64, 80}).requires_grad_();
  for (int64_t bad : {0, -2048, 1000, 3}) {
    AdamW8bitOptions o;
    o.block_size = bad;
    test::expect_error([&] { AdamW8bit({w}, o); }, {"block_size", std::to_string(bad), "positive power of two"});
  }
  test::expect_error([&] { AdamW8bit({w}, {.lr = -1}); }, {"lr"});
  // an AdamW state dict: refused, naming the state; converted, accepted
  Tensor v = w.detach().clone().requires_grad_();
  auto adamw = make_adamw({v}, AdamOptions::adamw());
  v.set_grad(randn({64, 80}));
  adamw->step();
  AdamW8bit eight({w}, {});
  test::expect_error([&] { eight.load_state_dict(adamw->state_dict()); },
                     {"state.0.0.exp_avg", "32-bit AdamW state", "adamw8bit", "adamw_state_to_8bit"});
  eight.load_state_dict(adamw_state_to_8bit(adamw->state_dict(), {}));
  // the 8-bit dict into AdamW: refused; converted back, the moments within the quantisation error
  test::expect_error([&] { adamw->load_state_dict(eight.state_dict()); },
                     {"state.0.0.exp_avg_", "not a state this optimizer keeps"});
  const StateDict back = adamw8bit_state_to_32bit(eight.state_dict());
  const StateDict orig = adamw->state_dict();
  const Tensor m = orig.at("state.0.0.exp_avg"), m8 = back.at("state.0.0.exp_avg");
  const double scale = max(abs(m)).item();
  EXPECT_LE(max(abs(sub(m, m8))).item(), 0.01 * scale);
  adamw->load_state_dict(back);
  // a code without its absmax; an absmax of the wrong length (another block size)
  StateDict sd = eight.state_dict();
  sd.erase("state.0.0.exp_avg_sq_absmax");
  test::expect_error([&] { eight.load_state_dict(sd); }, {"state.0.0.exp_avg_sq_code", "without"});
  AdamW8bit other({w}, {.block_size = 256});
  test::expect_error([&] { other.load_state_dict(eight.state_dict()); }, {"state.0.0.exp_avg_absmax", "float32[20]"});
  // AMSGrad's state does not convert
  Tensor u = w.detach().clone().requires_grad_();
  AdamOptions ams = AdamOptions::adamw();
  ams.amsgrad = true;
  auto amsgrad = make_adamw({u}, ams);
  u.set_grad(randn({64, 80}));
  amsgrad->step();
  test::expect_error([&] { adamw_state_to_8bit(amsgrad->state_dict(), {}); }, {"AMSGrad"});
}

}  // namespace
}  // namespace castor::optim
