// castor::dist and DistributedDataParallel in one process: the group of one, bucket planning, hook order (all-reduces
// start before backward ends), no_sync accumulation, compression, sync batch norm, loader shards, the mpirun line.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "castor/autograd.h"
#include "castor/data.h"
#include "castor/ddp.h"
#include "castor/dist.h"
#include "castor/functional.h"
#include "castor/models.h"
#include "castor/nn.h"
#include "castor/ops.h"
#include "castor/random.h"
#include "castor/train_config.h"
#include "test_util.h"

namespace castor {
namespace {

using Clock = std::chrono::steady_clock;

// A stand-in for two ranks whose other rank holds the same values: all_reduce(Sum) doubles the tensor (16-bit
// tensors: each element added to itself in float32, rounded once, as the MPI group does). It logs each call.
class MirrorGroup : public dist::ProcessGroup {
 public:
  struct Launch {
    Clock::time_point at;
    size_t event;  // position in the shared event log
    DType dtype;
    int64_t numel;
  };
  explicit MirrorGroup(std::vector<std::string>* events) : events_(events) {}
  std::string backend() const override { return "mirror"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void barrier() override {}
  std::unique_ptr<dist::Work> all_reduce_async(const Tensor& t, dist::ReduceOp op) override {
    launches.push_back({Clock::now(), events_->size(), t.dtype(), t.numel()});
    events_->push_back("all_reduce " + std::to_string(launches.size() - 1));
    Tensor wide = t.to(DType::Float32);
    t.detach().copy_(add(wide, wide));
    return std::make_unique<Done>();
  }
  void broadcast(const Tensor&, int) override { ++broadcasts; }
  Tensor all_gather(const Tensor& t) override { return stack({t, t}); }
  // (rank 0's chunk summed with its mirror, and the mirror's copy gathered beside its own)
  std::unique_ptr<dist::Work> reduce_scatter_async(const Tensor& out, const Tensor& in) override {
    const Tensor mine = in.narrow(0, 0, out.numel()).to(DType::Float32);
    out.detach().copy_(add(mine, mine));
    return std::make_unique<Done>();
  }
  std::unique_ptr<dist::Work> all_gather_into_async(const Tensor& out, const Tensor& in) override {
    out.detach().copy_(cat({in, in}, 0));
    return std::make_unique<Done>();
  }

  std::vector<Launch> launches;
  int broadcasts = 0;

 private:
  struct Done : dist::Work {
    void wait() override {}
    bool test() override { return true; }
  };
  std::vector<std::string>* events_;
};

// A small CNN's gradients without any wrapper: the oracle (with a mirrored second rank, the average is the same).
std::vector<Tensor> plain_grads(const nn::ModulePtr& model, const std::vector<Tensor>& xs, const Tensor& y) {
  model->zero_grad(/*set_to_none=*/true);
  for (const Tensor& x : xs) F::cross_entropy((*model)(x), y).backward();
  std::vector<Tensor> out;
  for (const Tensor& p : model->parameters()) out.push_back(p.grad().clone());
  return out;
}

Tensor images(uint64_t seed) {
  Generator gen(seed);
  return randn({4, 1, 8, 8}, DType::Float32, &gen);
}
const Tensor kLabels = tensor({1, 3, 0, 7}, DType::Int64);

TEST(DistLocal, PlainProcessIsAGroupOfOne) {
  EXPECT_FALSE(dist::is_launched_by_mpirun());
  EXPECT_EQ(dist::world_size(), 1);
  EXPECT_EQ(dist::rank(), 0);
  EXPECT_EQ(dist::default_group().backend(), "local");
  Tensor t = tensor({1.5, -2.0, 3.0});
  dist::all_reduce(t);
  dist::all_reduce(t, dist::ReduceOp::Max);
  dist::broadcast(t, 0);
  dist::barrier();
  EXPECT_TRUE(test::bit_equal(t, tensor({1.5, -2.0, 3.0})));
  const Tensor g = dist::all_gather(t);
  EXPECT_EQ(g.shape(), (Shape{1, 3}));
  EXPECT_TRUE(test::bit_equal(g.select(0, 0), t));
  EXPECT_THROW(dist::broadcast(t, 1), Error);
  EXPECT_THROW(dist::all_reduce(t.t().contiguous().view({3, 1}).expand({3, 2})), Error);  // not contiguous
}

TEST(DdpBuckets, ReverseRegistrationOrderUpToTheCap) {
  // Sizes in bytes of parameters 0..5; cap 100. Reverse order: 5 (60), 4 (30) | 3 (50), 2 (40) | 1 (200) | 0 (10).
  const auto plan = nn::plan_buckets({10, 200, 40, 50, 30, 60}, 100);
  const std::vector<std::vector<size_t>> want = {{5, 4}, {3, 2}, {1}, {0}};
  EXPECT_EQ(plan, want);
  EXPECT_EQ(nn::plan_buckets({}, 100).size(), 0u);
  EXPECT_EQ(nn::plan_buckets({1, 1, 1}, 1000), (std::vector<std::vector<size_t>>{{2, 1, 0}}));
}

TEST(Ddp, BucketsStartBeforeBackwardEnds) {
  manual_seed(3);
  auto model = models::simple_cnn(1, 8, 8);
  const std::vector<Tensor> want = plain_grads(model, {images(1)}, kLabels);
  std::vector<std::string> events;
  MirrorGroup group(&events);
  // SimpleCNN's parameters: conv1 (1 KiB), conv2 (72 KiB), fc1 (256 KiB), fc2 (5 KiB) with their biases. A cap of
  // 0.1 MiB gives fc2+fc1.bias | fc1.weight | conv2+conv1.
  auto ddp = std::make_shared<nn::DistributedDataParallel>(model, nn::DDPOptions{.bucket_cap_mb = 0.1}, &group);
  EXPECT_EQ(group.broadcasts, 8);  // every parameter (SimpleCNN has no buffers)
  const auto buckets = ddp->buckets();
  ASSERT_EQ(buckets.size(), 3u);
  const std::vector<Tensor> params = model->parameters();
  std::vector<Clock::time_point> grad_time(params.size());
  for (size_t k = 0; k < params.size(); ++k)
    params[k].register_post_accumulate_grad_hook([&, k](const Tensor&) {
      grad_time[k] = Clock::now();
      events.push_back("grad " + std::to_string(k));
    });
  model->zero_grad(/*set_to_none=*/true);
  Clock::time_point finished;
  const Tensor loss = F::cross_entropy((*ddp)(images(1)), kLabels);
  loss.backward();
  finished = Clock::now();
  ASSERT_EQ(group.launches.size(), 3u);
  // The first bucket (fc2, fc1.bias) goes out while conv1's gradient (parameter 0, the last backward reaches) is
  // still to come; buckets go out in order.
  EXPECT_LT(group.launches[0].at, grad_time[0]);
  EXPECT_LT(group.launches[0].event, std::find(events.begin(), events.end(), "grad 0") - events.begin());
  EXPECT_LT(group.launches[0].at, group.launches[1].at);
  EXPECT_LE(group.launches[2].at, finished);
  EXPECT_EQ(ddp->stats().buckets_launched_in_backward, 2);  // the last bucket closes with the last gradient
  // The mirrored rank makes the average equal to this rank's gradient.
  for (size_t k = 0; k < params.size(); ++k) EXPECT_TRUE(test::close(params[k].grad(), want[k], 1e-6, 1e-7)) << k;
}

TEST(Ddp, NoSyncAccumulatesThenAveragesTheSum) {
  manual_seed(4);
  auto model = models::simple_cnn(1, 8, 8);
  const std::vector<Tensor> want = plain_grads(model, {images(1), images(2), images(3)}, kLabels);
  std::vector<std::string> events;
  MirrorGroup group(&events);
  nn::DistributedDataParallel ddp(model, {}, &group);
  model->zero_grad(/*set_to_none=*/true);
  {
    auto no_sync = ddp.no_sync();
    F::cross_entropy(ddp(images(1)), kLabels).backward();
    F::cross_entropy(ddp(images(2)), kLabels).backward();
  }
  EXPECT_EQ(group.launches.size(), 0u);
  F::cross_entropy(ddp(images(3)), kLabels).backward();
  EXPECT_EQ(group.launches.size(), 1u);  // all of SimpleCNN in one 25 MB bucket
  const std::vector<Tensor> params = model->parameters();
  for (size_t k = 0; k < params.size(); ++k) EXPECT_TRUE(test::close(params[k].grad(), want[k], 1e-6, 1e-7)) << k;
}

// A tied parameter (a GPT's wte = lm_head) takes a gradient from each use; it is reduced once, after both, in a
// bucket launched at the end of backward: the gradients equal the plain model's.
TEST(Ddp, TiedParametersAreReducedAfterAllTheirUses) {
  models::GPTConfig c;
  c.n_layer = 1, c.n_head = 2, c.n_embd = 16, c.block_size = 8, c.vocab_size = 11;
  auto model = models::gpt(c, 3);
  const Tensor x = tensor({1, 2, 3, 4, 5, 6, 7, 8}, Shape{1, 8}, DType::Int64);
  auto loss_of = [&](nn::Module& m) {
    const Tensor logits = m(x);
    return F::cross_entropy(logits.reshape({-1, c.vocab_size}), x.reshape({-1}));
  };
  loss_of(*model).backward();
  std::vector<Tensor> want;
  for (const Tensor& p : model->parameters()) want.push_back(p.grad().clone());
  std::vector<std::string> events;
  MirrorGroup group(&events);
  nn::DistributedDataParallel ddp(model, {}, &group);
  model->zero_grad(/*set_to_none=*/true);
  loss_of(ddp).backward();
  EXPECT_EQ(group.launches.size(), 2u);  // the untied parameters, then the tied one
  const std::vector<Tensor> params = model->parameters();
  for (size_t k = 0; k < params.size(); ++k) EXPECT_TRUE(test::close(params[k].grad(), want[k], 1e-6, 1e-7)) << k;
}

TEST(Ddp, CompressionSendsBFloat16) {
  manual_seed(5);
  auto model = models::simple_cnn(1, 8, 8);
  const std::vector<Tensor> want = plain_grads(model, {images(1)}, kLabels);
  std::vector<std::string> events;
  MirrorGroup group(&events);
  nn::DistributedDataParallel ddp(model, {.compression = DType::BFloat16}, &group);
  model->zero_grad(/*set_to_none=*/true);
  F::cross_entropy(ddp(images(1)), kLabels).backward();
  ASSERT_EQ(group.launches.size(), 1u);
  EXPECT_EQ(group.launches[0].dtype, DType::BFloat16);
  // Halved in float32, rounded to bfloat16, doubled exactly: the gradient rounded once to bfloat16.
  const std::vector<Tensor> params = model->parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    EXPECT_EQ(params[k].grad().dtype(), DType::Float32);
    EXPECT_TRUE(test::bit_equal(params[k].grad(), want[k].to(DType::BFloat16).to(DType::Float32))) << k;
  }
  EXPECT_THROW(nn::DistributedDataParallel(model, {.compression = DType::Float32}, &group), Error);
}

TEST(Ddp, NamesParametersUnderModule) {
  auto model = models::simple_cnn(1, 8, 8);
  nn::DistributedDataParallel ddp(model);  // the default group of one
  EXPECT_EQ(ddp.named_parameters()[0].first, "module.conv1.weight");
  EXPECT_EQ(ddp.module(), model);
}

TEST(AutogradHooks, PostAccumulateHookAndQueuedCallbackRunInOrder) {
  Tensor w = tensor({2.0, 3.0}).requires_grad_();
  std::vector<std::string> log;
  w.register_post_accumulate_grad_hook([&](const Tensor& leaf) {
    log.push_back("accumulated " + std::to_string(leaf.grad().to_vector<double>()[0]));
    autograd::queue_callback([&] { log.push_back("end"); });
  });
  // w is used twice: two accumulations (1 then 1 + 2), then both queued callbacks.
  sum(add(w, mul(w, 2.0))).backward();
  const std::vector<std::string> want = {"accumulated 1.000000", "accumulated 3.000000", "end", "end"};
  EXPECT_EQ(log, want);
  EXPECT_THROW(autograd::queue_callback([] {}), Error);
  EXPECT_THROW(mul(w, 2.0).register_post_accumulate_grad_hook([](const Tensor&) {}), Error);
}

// With one rank, sync batch norm is batch norm: outputs, running statistics and every gradient.
TEST(SyncBatchNorm, OneRankEqualsBatchNorm) {
  Generator gen(9);
  const Tensor x = randn({4, 3, 5, 5}, DType::Float32, &gen).mul_(2.0).add_(1.0);
  const Tensor w_out = randn({4, 3, 5, 5}, DType::Float32, &gen);
  auto run = [&](bool sync) {
    manual_seed(1);
    nn::BatchNorm2d bn(3);
    bn.weight.detach().copy_(tensor({0.5, 1.5, -1.0}));
    bn.bias.detach().copy_(tensor({0.1, 0.2, 0.3}));
    nn::convert_sync_batchnorm(bn, sync);
    Tensor xi = x.clone().requires_grad_();
    sum(mul(bn(xi), w_out)).backward();
    return std::vector<Tensor>{bn(x.clone()).detach(), bn.running_mean.clone(), bn.running_var.clone(), xi.grad(),
                               bn.weight.grad(),       bn.bias.grad()};
  };
  const auto want = run(false), got = run(true);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(test::close(got[i], want[i], 1e-5, 1e-5)) << i;
}

// The shards of a batch, side by side, are the batch one loader with no shards gives (augmentation included).
TEST(LoaderShards, ContiguousShardsOfTheGlobalBatch) {
  const ImageDataset ds = data::make_synthetic(64, 3, 8, 8, 10, 1);
  data::LoaderOptions o{.batch_size = 12, .shuffle = true, .augment = true, .drop_last = true, .seed = 5};
  const data::Batch whole = data::DataLoader(ds, o).make_batch(2, 3);
  for (int64_t shard = 0; shard < 3; ++shard) {
    data::LoaderOptions so = o;
    so.shard = shard;
    so.num_shards = 3;
    const data::Batch part = data::DataLoader(ds, so).make_batch(2, 3);
    EXPECT_TRUE(test::bit_equal(part.images, whole.images.narrow(0, 4 * shard, 4))) << shard;
    EXPECT_TRUE(test::bit_equal(part.labels, whole.labels.narrow(0, 4 * shard, 4))) << shard;
  }
  data::LoaderOptions bad = o;
  bad.num_shards = 5;  // 12 does not split in 5
  EXPECT_THROW(data::DataLoader(ds, bad), Error);
}

TEST(NprocFlag, RelaunchesUnderMpirunWithTheFlagsASmallMachineNeeds) {
  train::TrainConfig c = train::parse_train_flags({"--nproc", "2", "--steps", "3"});
  EXPECT_EQ(c.nproc, 2);
  const auto cmd = train::mpirun_command(c, "/x/castor", {"--nproc", "2", "--steps", "3"});
  ASSERT_GE(cmd.size(), 10u);
  const std::vector<std::string> head(cmd.begin(), cmd.begin() + 6);
  EXPECT_EQ(head, (std::vector<std::string>{"mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"}));
  EXPECT_EQ(std::find(cmd.begin(), cmd.end(), "--allow-run-as-root") != cmd.end(), geteuid() == 0);
  const std::vector<std::string> tail(cmd.end() - 5, cmd.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"train", "--nproc", "2", "--steps", "3"}));
  EXPECT_TRUE(train::mpirun_command(train::parse_train_flags({"--nproc", "1"}), "/x/castor", {}).empty());
  EXPECT_THROW(train::parse_train_flags({"--nproc", "0"}), Error);
}

}  // namespace
}  // namespace castor
