// The program the Mpirun* tests launch with `mpirun -np 2`: one check per mode, exit 0 when every rank agrees.
//   collectives  all_reduce (sum/max, float32/float64/16-bit), broadcast, all_gather against hand-worked values
//   inf          amp::initialize O1 fp16 + DistributedDataParallel; inf injected into rank 1's gradient only
//   syncbn       sync batch norm on 2 ranks against batch norm of the whole batch
//   kill         rank 1 kills itself mid-job while rank 0 waits in an all-reduce
//   mismatch     the ranks wrap models of different shapes: both raise a castor::Error
#include <signal.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <string>

#include "castor/amp.h"
#include "castor/autograd.h"
#include "castor/ddp.h"
#include "castor/dist.h"
#include "castor/functional.h"
#include "castor/half.h"
#include "castor/models.h"
#include "castor/ops.h"
#include "castor/optim.h"
#include "castor/random.h"

namespace {

using namespace castor;

int g_failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "rank %d: FAILED: %s\n", dist::rank(), what.c_str());
  ++g_failures;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

// Whether `t` holds the same bits on every rank.
bool equal_on_all_ranks(const Tensor& t) {
  const Tensor all = dist::all_gather(t.contiguous());
  for (int r = 1; r < dist::world_size(); ++r)
    if (!same_bits(all.select(0, r), all.select(0, 0))) return false;
  return true;
}

void collectives() {
  const int r = dist::rank();  // ranks 0 and 1
  Tensor f = tensor({r + 1.0, -2.0 * (r + 1), 0.25});
  dist::all_reduce(f);
  expect(same_bits(f, tensor({3.0, -6.0, 0.5})), "float32 sum");
  Tensor m = tensor({r + 1.0, -2.0 * (r + 1)}, DType::Float64);
  dist::all_reduce(m, dist::ReduceOp::Max);
  expect(same_bits(m, tensor({2.0, -2.0}, DType::Float64)), "float64 max");
  // 16-bit: each pair added in float32 and rounded once. bfloat16 1 + 2^-8 is a tie (rounds to even 1), 1 + 3*2^-9
  // rounds up; float16 2048 + 1 is a tie (2048), 2048 + 3 rounds to 2052.
  const std::vector<double> bf_mine = r == 0 ? std::vector<double>{1.0, 1.0, -3.5}
                                             : std::vector<double>{0x1p-8, 3 * 0x1p-9, 1.25};
  Tensor bf = tensor(bf_mine, {3}, DType::BFloat16);
  dist::all_reduce(bf);
  expect(same_bits(bf, tensor({1.0, 1.0 + 0x1p-7, -2.25}, DType::BFloat16)), "bfloat16 sum");
  Tensor h = tensor(r == 0 ? std::vector<double>{2048, 2048} : std::vector<double>{1, 3}, {2}, DType::Float16);
  dist::all_reduce(h);
  expect(same_bits(h, tensor({2048, 2052}, DType::Float16)), "float16 sum");
  Tensor b = full({2, 2}, r == 1 ? 7.0 : -1.0);
  dist::broadcast(b, /*root=*/1);
  expect(same_bits(b, full({2, 2}, 7.0)), "broadcast from rank 1");
  const Tensor g = dist::all_gather(full({3}, r * 10.0, DType::Int64));
  expect(g.shape() == Shape{2, 3} && same_bits(g, tensor({0, 0, 0, 10, 10, 10}, {2, 3}, DType::Int64)), "all_gather");
  bool raised = false;
  try {
    dist::broadcast(b, /*root=*/2);
  } catch (const Error& e) {
    raised = std::string(e.what()).find("root 2") != std::string::npos;
  }
  expect(raised, "broadcast from a rank that does not exist raises");
}

// Two ranks train SimpleCNN with O1 float16 (Apex style) through the wrapper; at step 2 rank 1 alone finds an inf in
// its gradient (after the all-reduce). Both must skip that step, back off the scale, and keep equal weights.
void inf_on_one_rank() {
  manual_seed(11 + dist::rank());  // different initial weights: the wrapper must broadcast rank 0's
  auto model = models::simple_cnn(1, 8, 8);
  auto ddp = std::make_shared<nn::DistributedDataParallel>(model);
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  auto amp = amp::initialize(*model, {&opt}, amp::OptLevel::O1, DType::Float16);
  for (int step = 0; step < 5; ++step) {
    Generator gen(100 * step + dist::rank());
    const Tensor x = randn({4, 1, 8, 8}, DType::Float32, &gen);
    const Tensor y = tensor({1, 2, 3, static_cast<double>(step)}, DType::Int64);
    opt.zero_grad();
    Tensor loss;
    {
      auto fw = amp->forward();
      loss = F::cross_entropy((*ddp)(x).float_(), y);
    }
    amp->scale_loss(loss, opt).backward();
    if (step == 2 && dist::rank() == 1) model->parameters()[3].grad().view({-1}).narrow(0, 5, 1).fill_(INFINITY);
    opt.step();
  }
  const auto& scaler = amp->scaler();
  expect(scaler.steps_skipped() == 1, "one skipped step, got " + std::to_string(scaler.steps_skipped()));
  expect(scaler.get_scale() == 32768.0, "the scale backed off once: " + std::to_string(scaler.get_scale()));
  expect(equal_on_all_ranks(scalar_tensor(scaler.get_scale(), DType::Float64)), "the same scale on both ranks");
  for (const auto& [name, p] : model->named_parameters()) expect(equal_on_all_ranks(p.detach()), "equal " + name);
}

// Rank r holds rows [2r, 2r + 2) of a (4, 3, 5, 5) batch; sync batch norm must give the whole batch's normalisation:
// each rank's output and input gradient rows, the running statistics, and the weight gradient summed over ranks.
void sync_batch_norm() {
  Generator gen(7);
  const Tensor x = randn({4, 3, 5, 5}, DType::Float32, &gen).mul_(3.0).add_(-1.0);
  const Tensor w_out = randn({4, 3, 5, 5}, DType::Float32, &gen);
  auto make = [] {
    auto bn = std::make_shared<nn::BatchNorm2d>(3);
    bn->weight.detach().copy_(tensor({0.5, 1.5, -1.0}));
    return bn;
  };
  auto whole = make();
  Tensor xw = x.clone().requires_grad_();
  const Tensor yw = (*whole)(xw);
  sum(mul(yw, w_out)).backward();
  auto part = make();
  nn::convert_sync_batchnorm(*part);
  const int64_t r0 = 2 * dist::rank();
  Tensor xp = x.narrow(0, r0, 2).clone().requires_grad_();
  const Tensor yp = (*part)(xp);
  sum(mul(yp, w_out.narrow(0, r0, 2))).backward();
  auto close = [](const Tensor& a, const Tensor& b) {
    return max(abs(sub(a, b))).item() <= 1e-5 * (1 + max(abs(b)).item());
  };
  expect(close(yp, yw.narrow(0, r0, 2)), "output rows");
  expect(close(xp.grad(), xw.grad().narrow(0, r0, 2)), "input gradient rows");
  expect(close(part->running_mean, whole->running_mean) && close(part->running_var, whole->running_var),
         "running stats");
  Tensor wg = part->weight.grad().clone(), bg = part->bias.grad().clone();
  dist::all_reduce(wg);
  dist::all_reduce(bg);
  expect(close(wg, whole->weight.grad()) && close(bg, whole->bias.grad()), "weight and bias gradients");
}

// Rank 1 wraps a model of another shape (11 classes): rather than all-reducing buffers of different sizes (undefined
// behaviour in MPI; Open MPI corrupts memory), both ranks' wrappers raise a castor::Error saying what differs.
void mismatched_models() {
  auto model = models::simple_cnn(1, 8, 8, dist::rank() == 0 ? 10 : 11);
  std::string message;
  try {
    nn::DistributedDataParallel ddp(model);
  } catch (const Error& e) {
    message = e.what();
  }
  // SimpleCNN(1, 8, 8, k): conv1 320 + conv2 18496 + fc1 32896 + fc2 129k + k elements: 53002 and 53131.
  expect(message.find("rank 1's model has 8 parameter and buffer tensors with 53131 elements, rank 0's 8 with 53002") !=
             std::string::npos,
         "the wrapper names the rank and the parameter counts: '" + message + "'");
}

void kill_one_rank() {
  Tensor t = ones({1024});
  for (int i = 0;; ++i) {
    if (i == 3 && dist::rank() == 1) raise(SIGKILL);
    dist::all_reduce(t);  // rank 0 waits here for a rank that is gone
    t.fill_(1.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    dist::init();
    if (dist::world_size() != 2) {
      std::fprintf(stderr, "dist_helper: run it with mpirun -np 2\n");
      return 2;
    }
    if (mode == "collectives")
      collectives();
    else if (mode == "inf")
      inf_on_one_rank();
    else if (mode == "syncbn")
      sync_batch_norm();
    else if (mode == "kill")
      kill_one_rank();
    else if (mode == "mismatch")
      mismatched_models();
    else
      return std::fprintf(stderr, "dist_helper: unknown mode '%s'\n", mode.c_str()), 2;
    // Every rank's verdict: the job succeeds only if no rank failed.
    Tensor failures = scalar_tensor(g_failures, DType::Float64);
    dist::all_reduce(failures);
    if (dist::rank() == 0) std::printf("%s: %s\n", mode.c_str(), failures.item() == 0 ? "ok" : "FAILED");
    return failures.item() == 0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", dist::rank(), e.what());
    dist::abort(1);
  }
}
