// The models and layers against their PyTorch twins (tests/oracle/models_oracle.py): state-dict names,
// initialisation, logits from a shared state dict, and fitting one fixed batch in float32 and bfloat16.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "castor/autocast.h"
#include "castor/autograd.h"
#include "castor/functional.h"
#include "castor/models.h"
#include "castor/nn.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "kernels/layers.h"
#include "test_util.h"

namespace castor::models {
namespace {

namespace fs = std::filesystem;

struct ModelCase {
  std::string name;  // make_model's name, or "layer_zoo"
  int64_t channels, height, width, classes;
};

void PrintTo(const ModelCase& c, std::ostream* os) {
  *os << c.name << "(" << c.channels << ", " << c.height << ", " << c.width << ", " << c.classes << ")";
}

std::string case_name(const ::testing::TestParamInfo<ModelCase>& info) {
  const ModelCase& c = info.param;
  return c.name + "_" + std::to_string(c.channels) + "x" + std::to_string(c.height) + "x" + std::to_string(c.width);
}

// One of every layer kind, mirrored by layer_zoo() in the oracle script. Input (N, C, 12, 12) -> (N, 5).
nn::ModulePtr layer_zoo(int64_t channels) {
  using namespace nn;
  return std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
      std::make_shared<Conv2d>(channels, 8, /*kernel_size=*/3, /*stride=*/2, /*padding=*/1),
      std::make_shared<BatchNorm2d>(8), std::make_shared<GELU>(),
      std::make_shared<Conv2d>(8, 8, /*kernel_size=*/3, /*stride=*/1, /*padding=*/2, /*dilation=*/2, /*groups=*/2),
      std::make_shared<BatchNorm2d>(8, /*eps=*/1e-3, /*momentum=*/0.3, /*affine=*/false),
      std::make_shared<BatchNorm2d>(8, /*eps=*/1e-5, /*momentum=*/0.1, /*affine=*/true,
                                    /*track_running_stats=*/false),
      std::make_shared<ReLU>(), std::make_shared<AvgPool2d>(/*kernel_size=*/2),
      std::make_shared<MaxPool2d>(/*kernel_size=*/3, /*stride=*/1, /*padding=*/1),
      std::make_shared<AdaptiveAvgPool2d>(/*output_size=*/2), std::make_shared<Flatten>(),
      std::make_shared<Linear>(32, 5), std::make_shared<GELU>(/*tanh_approximate=*/true)});
}

nn::ModulePtr build(const ModelCase& c) {
  return c.name == "layer_zoo" ? layer_zoo(c.channels) : make_model(c.name, c.channels, c.height, c.width, c.classes);
}

std::vector<std::string> oracle_args(const std::string& mode, const ModelCase& c, const std::string& out) {
  return {mode,
          c.name,
          std::to_string(c.channels),
          std::to_string(c.height),
          std::to_string(c.width),
          std::to_string(c.classes),
          out};
}

// ---- the raw tensor exchange: DIR/manifest.txt lines "NAME DTYPE SHAPE FILE", little-endian data in DIR/FILE ----

std::string shape_field(const Shape& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ",") + std::to_string(d);
  return s.empty() ? "-" : s;
}

void write_tensors(const fs::path& dir, const StateDict& tensors) {
  fs::create_directories(dir);
  std::ofstream manifest(dir / "manifest.txt");
  int i = 0;
  for (const auto& [name, t] : tensors) {
    const std::string file = "t" + std::to_string(i++) + ".bin";
    Tensor c = t.contiguous();
    std::ofstream(dir / file, std::ios::binary).write(static_cast<const char*>(c.data_ptr()), c.nbytes());
    manifest << name << " " << dtype_name(t.dtype()) << " " << shape_field(t.shape()) << " " << file << "\n";
  }
}

StateDict read_tensors(const fs::path& dir) {
  StateDict out;
  std::ifstream manifest(dir / "manifest.txt");
  std::string name, dtype, shape, file;
  while (manifest >> name >> dtype >> shape >> file) {
    Shape dims;
    if (shape != "-") {
      std::stringstream ss(shape);
      for (std::string d; std::getline(ss, d, ',');) dims.push_back(std::stoll(d));
    }
    std::ifstream in(dir / file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const DType dt = parse_dtype(dtype);
    EXPECT_EQ(bytes.size(), shape_numel(dims) * dtype_size(dt)) << file;
    out[name] = from_blob(bytes.data(), dims, dt);
  }
  return out;
}

// ---- state-dict names and initialisation ----

struct OracleEntry {
  std::string kind, name, dtype, shape;
  double min, max, mean, std, bound;
};

std::vector<OracleEntry> describe(const ModelCase& c) {
  const test::ScratchDir dir("describe_" + case_name({c, 0}));
  const std::string file = dir + "/describe.txt";
  std::vector<OracleEntry> out;
  if (!test::run_oracle("models_oracle.py", oracle_args("describe", c, file))) return out;
  std::ifstream in(file);
  OracleEntry e;
  std::string min, max, mean, std, bound;  // read as text: operator>> cannot parse "inf"
  while (in >> e.kind >> e.name >> e.dtype >> e.shape >> min >> max >> mean >> std >> bound) {
    e.min = std::stod(min), e.max = std::stod(max), e.mean = std::stod(mean), e.std = std::stod(std);
    e.bound = std::stod(bound);
    out.push_back(e);
  }
  EXPECT_FALSE(out.empty()) << "the oracle described no tensors";
  return out;
}

class ModelTwin : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ModelTwin, StateDictNamesShapesAndOrderMatchPyTorch) {
  nn::ModulePtr model = build(GetParam());
  std::vector<std::pair<std::string, Tensor>> castor;
  for (auto& [n, t] : model->named_parameters()) castor.emplace_back("param " + n, t);
  for (auto& [n, t] : model->named_buffers()) castor.emplace_back("buffer " + n, t);
  const std::vector<OracleEntry> torch = describe(GetParam());
  ASSERT_EQ(castor.size(), torch.size());
  for (size_t i = 0; i < torch.size(); ++i) {
    const OracleEntry& e = torch[i];
    EXPECT_EQ(castor[i].first, e.kind + " " + e.name) << "entry " << i;
    EXPECT_EQ(dtype_name(castor[i].second.dtype()), e.dtype) << e.name;
    EXPECT_EQ(shape_field(castor[i].second.shape()), e.shape) << e.name;
  }
  EXPECT_EQ(model->state_dict().size(), torch.size());
}

TEST_P(ModelTwin, InitialisationMatchesPyTorch) {
  manual_seed(0);
  nn::ModulePtr model = build(GetParam());
  const StateDict sd = model->state_dict();
  for (const OracleEntry& e : describe(GetParam())) {
    ASSERT_TRUE(sd.count(e.name)) << e.name;
    const std::vector<double> v = sd.at(e.name).to_vector<double>();
    const double n = static_cast<double>(v.size());
    if (e.min == e.max) {  // a constant: BatchNorm weight/bias, running stats, counters
      for (double x : v) ASSERT_EQ(x, e.min) << e.name;
      continue;
    }
    double lo = v[0], hi = v[0], mean = 0, var = 0;
    for (double x : v) lo = std::min(lo, x), hi = std::max(hi, x), mean += x / n;
    for (double x : v) var += (x - mean) * (x - mean) / (n - 1);
    if (std::isfinite(e.bound)) {
      EXPECT_GE(lo, -e.bound * (1 + 1e-6)) << e.name;
      EXPECT_LE(hi, e.bound * (1 + 1e-6)) << e.name;
    }
    // Both are samples of the same distribution: allow about four standard errors of each statistic.
    EXPECT_NEAR(std::sqrt(var), e.std, (0.02 + 4 * std::sqrt(0.5 / n)) * e.std) << e.name;
    EXPECT_NEAR(mean, e.mean, 5 * e.std / std::sqrt(n)) << e.name;
  }
}

// ---- logits from a shared state dict ----

TEST_P(ModelTwin, PyTorchGivesTheSameLogitsFromOurStateDict) {
  const ModelCase& c = GetParam();
  manual_seed(1);
  nn::ModulePtr model = build(c);
  Generator gen(42);
  const Shape input_shape{4, c.channels, c.height, c.width};
  NoGradGuard no_grad;
  model->forward(randn(input_shape, DType::Float32, &gen));  // training mode: non-trivial running statistics
  const Tensor x = randn(input_shape, DType::Float32, &gen);

  const test::ScratchDir dir("forward_" + case_name({c, 0}));
  StateDict exchange = model->state_dict();
  exchange["input"] = x;
  write_tensors(dir, exchange);
  ASSERT_TRUE(test::run_oracle("models_oracle.py", oracle_args("forward", c, dir)));
  const StateDict torch = read_tensors(dir.path() / "out");

  model->eval();
  EXPECT_TRUE(test::close(model->forward(x), torch.at("eval_logits"), /*rtol=*/1e-4, /*atol=*/1e-5));
  model->train();
  EXPECT_TRUE(test::close(model->forward(x), torch.at("train_logits"), /*rtol=*/1e-4, /*atol=*/1e-5));
  for (const auto& [name, t] : model->state_dict())  // running statistics after the training-mode forward
    EXPECT_TRUE(test::close(t, torch.at(name), /*rtol=*/1e-4, /*atol=*/1e-6)) << name;
}

INSTANTIATE_TEST_SUITE_P(Models, ModelTwin,
                         ::testing::Values(ModelCase{"simplecnn", 3, 32, 32, 10}, ModelCase{"simplecnn", 1, 28, 28, 10},
                                           ModelCase{"resnet18", 3, 32, 32, 10}, ModelCase{"resnet9", 3, 32, 32, 10},
                                           ModelCase{"layer_zoo", 3, 12, 12, 5}),
                         case_name);

// ---- fitting one fixed batch ----

// Adam on float32 master copies of the parameters; the model's (possibly 16-bit) parameters get the rounded values.
class InlineAdam {
 public:
  InlineAdam(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
    for (const Tensor& p : params_) {
      master_.push_back(p.detach().to(DType::Float32).clone());
      m_.push_back(zeros(p.shape()));
      v_.push_back(zeros(p.shape()));
    }
  }
  void step() {
    NoGradGuard no_grad;
    ++t_;
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor g = params_[i].grad().to(DType::Float32);
      m_[i] = m_[i] * b1 + g * (1 - b1);
      v_[i] = v_[i] * b2 + g * g * (1 - b2);
      const Tensor m_hat = m_[i] / (1 - std::pow(b1, t_)), v_hat = v_[i] / (1 - std::pow(b2, t_));
      master_[i].sub_(m_hat / (sqrt(v_hat) + eps), lr_);
      params_[i].copy_(master_[i]);
    }
  }

 private:
  std::vector<Tensor> params_, master_, m_, v_;
  double lr_;
  int t_ = 0;
};

// Trains `model` (cast to `dtype`) with Adam on 4 fixed images until the cross-entropy is below 0.01 or
// `max_steps` pass; returns {first loss, last loss}.
std::pair<double, double> fit_one_batch(nn::Module& model, DType dtype, bool keep_batchnorm_fp32, int max_steps,
                                        double lr) {
  model.to(dtype, keep_batchnorm_fp32);
  Generator gen(5);
  const Tensor x = randn({4, 3, 32, 32}, DType::Float32, &gen).to(dtype);
  const Tensor y = tensor({0, 1, 2, 3}, DType::Int64);
  InlineAdam adam(model.parameters(), lr);
  double first = 0, last = 0;
  for (int step = 0; step < max_steps; ++step) {
    model.zero_grad(/*set_to_none=*/true);
    Tensor loss = F::cross_entropy(model.forward(x).to(DType::Float32), y);
    loss.backward();
    last = loss.item();
    if (step == 0) first = last;
    if (last < 0.01) break;
    adam.step();
  }
  return {first, last};
}

TEST(ModelFit, SimpleCnnFloat32) {
  manual_seed(2);
  auto [first, last] = fit_one_batch(*simple_cnn(3, 32, 32, 10), DType::Float32, false, /*max_steps=*/100, 1e-3);
  EXPECT_GT(first, 1.0);
  EXPECT_LT(last, 0.05);
}

TEST(ModelFit, SimpleCnnBFloat16) {
  manual_seed(2);
  auto [first, last] = fit_one_batch(*simple_cnn(3, 32, 32, 10), DType::BFloat16, false, /*max_steps=*/100, 1e-3);
  EXPECT_GT(first, 1.0);
  EXPECT_LT(last, 0.05);
}

TEST(ModelFit, ResNet18Float32) {
  manual_seed(2);
  auto [first, last] = fit_one_batch(*resnet18(3, 10), DType::Float32, false, /*max_steps=*/40, 1e-3);
  EXPECT_GT(first, 1.0);
  EXPECT_LT(last, 0.05);
}

TEST(ModelFit, ResNet9BFloat16Throughout) {  // BatchNorm parameters and running statistics in bfloat16 too
  manual_seed(2);
  auto [first, last] = fit_one_batch(*resnet9(3, 10), DType::BFloat16, false, /*max_steps=*/40, 1e-3);
  EXPECT_GT(first, 1.0);
  EXPECT_LT(last, 0.05);
}

TEST(ModelFit, ResNet18BFloat16BatchNormFp32) {
  manual_seed(2);
  auto [first, last] = fit_one_batch(*resnet18(3, 10), DType::BFloat16, /*keep_batchnorm_fp32=*/true,
                                     /*max_steps=*/40, 1e-3);
  EXPECT_GT(first, 1.0);
  EXPECT_LT(last, 0.05);
}

}  // namespace
}  // namespace castor::models

namespace castor {
namespace {

// PyTorch's rule: a first layer whose input needs no gradient computes none; the weights' gradients are the same.
TEST(ModelsBackward, FirstConvSkipsTheDataGradientOfAnInputWithoutGrad) {
  for (bool autocast : {false, true}) {
    SCOPED_TRACE(autocast ? "autocast bfloat16" : "float32");
    manual_seed(0);
    auto model = models::simple_cnn(3, 8, 8);
    Generator gen(1);
    const Tensor x = randn({4, 3, 8, 8}, DType::Float32, &gen);
    const Tensor y = randint(0, 10, {4}, &gen);
    auto data_passes = [&](const Tensor& input) {
      model->zero_grad();
      const int64_t before = kernels::conv_backward_data_count();
      Tensor loss;
      {
        amp::AutocastGuard guard(DType::BFloat16, autocast);  // forward and loss only, as torch.autocast
        loss = F::cross_entropy((*model)(input), y);
      }
      loss.backward();
      return kernels::conv_backward_data_count() - before;
    };
    EXPECT_EQ(data_passes(x), 1);  // conv2's only
    const Tensor w_grad = model->conv1->weight.grad().clone();
    const Tensor xg = x.clone().requires_grad_();
    EXPECT_EQ(data_passes(xg), 2);
    EXPECT_TRUE(xg.grad().defined());
    EXPECT_TRUE(test::bit_equal(model->conv1->weight.grad(), w_grad));
  }
}

}  // namespace
}  // namespace castor
