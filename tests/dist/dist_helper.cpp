// The program the Mpirun* tests launch with `mpirun -np 2`: one check per mode, exit 0 when every rank agrees.
//   collectives  all_reduce (sum/max, float32/float64/16-bit), broadcast, all_gather, reduce_scatter,
//                all_gather_into (blocking and async) and all_gather_slices against hand-worked values
//   inf          amp::initialize O1 fp16 + DistributedDataParallel; inf injected into rank 1's gradient only
//   syncbn       sync batch norm on 2 ranks against batch norm of the whole batch
//   kill         rank 1 kills itself mid-job while rank 0 waits in an all-reduce
//   mismatch     the ranks wrap models of different shapes: both raise a castor::Error
//   zero         ZeRO stages 1 and 2 against replicated data parallelism (AdamW and AdamW8bit, O0 and O2 bf16, and
//                bf16 gradients on the wire): the same weights and state, bit for bit
//   zero3build   ZeRO-3's sharded construction and a checkpoint whose model is written a tensor at a time: the
//                weights against the model built whole, the allocator's peak while building and while writing
#include <signal.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <string>
#include <tuple>

#include "castor/amp.h"
#include "castor/allocator.h"
#include "castor/autograd.h"
#include "castor/checkpoint.h"
#include "castor/ddp.h"
#include "castor/dist.h"
#include "castor/functional.h"
#include "castor/half.h"
#include "castor/llama.h"
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
  // reduce_scatter: rank r gets the sum of chunk r; with 2 ranks the same a + b as all_reduce (bfloat16 ties too).
  Tensor rs_in = tensor({r + 1.0, 10.0 * (r + 1), -0.5, 0.25 * r}), rs_out = empty({2});
  dist::reduce_scatter(rs_out, rs_in);
  expect(same_bits(rs_out, r == 0 ? tensor({3.0, 30.0}) : tensor({-1.0, 0.25})), "float32 reduce_scatter");
  const std::vector<double> bf_chunks = r == 0 ? std::vector<double>{1.0, 1.0, -3.5, 2048}
                                               : std::vector<double>{0x1p-8, 3 * 0x1p-9, 1.25, 8};
  Tensor bf_in = tensor(bf_chunks, {4}, DType::BFloat16), bf_out = empty({2}, DType::BFloat16);
  dist::reduce_scatter_async(bf_out, bf_in)->wait();
  expect(same_bits(bf_out, r == 0 ? tensor({1.0, 1.0 + 0x1p-7}, {2}, DType::BFloat16)
                                  : tensor({-2.25, 2048}, {2}, DType::BFloat16)),  // 2056 rounds to even 2048
         "bfloat16 reduce_scatter (async)");
  Tensor bf_all = tensor(bf_chunks, {4}, DType::BFloat16);
  dist::all_reduce(bf_all);
  expect(same_bits(bf_out, bf_all.narrow(0, 2 * r, 2).contiguous()), "reduce_scatter's chunk equals all_reduce's");
  Tensor ag_out = empty({2, 3}, DType::Float16);
  dist::all_gather_into(ag_out, full({3}, r + 0.5, DType::Float16));
  expect(same_bits(ag_out, tensor({0.5, 0.5, 0.5, 1.5, 1.5, 1.5}, {2, 3}, DType::Float16)), "all_gather_into");
  Tensor ag_async = empty({4}, DType::Int64);
  auto work = dist::all_gather_into_async(ag_async, tensor({r * 1.0, r * 2.0}, {2}, DType::Int64));
  while (!work->test()) {
  }
  expect(same_bits(ag_async, tensor({0, 0, 1, 2}, {4}, DType::Int64)), "all_gather_into (async)");
  // 5 elements in parts of 3: rank 0 owns [0, 3), rank 1 [3, 5); gathered in place, the rest overwritten.
  Tensor slices = full({5}, -1.0, DType::BFloat16);
  for (int64_t i = 3 * r; i < std::min<int64_t>(5, 3 * r + 3); ++i) slices.narrow(0, i, 1).fill_(10.0 * (r + 1) + i);
  dist::default_group().all_gather_slices_async(slices, 3)->wait();
  expect(same_bits(slices, tensor({10, 11, 12, 23, 24}, {5}, DType::BFloat16)), "all_gather_slices");
  bool refused = false;
  try {
    dist::reduce_scatter(empty({3}), rs_in);
  } catch (const Error& e) {
    refused = std::string(e.what()).find("is not 2 chunks of") != std::string::npos;
  }
  expect(refused, "reduce_scatter of a tensor that is not world size chunks raises");
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

// ZeRO stages 0 (replicated), 1 and 2 on the same model, data and seed: the weights and the gathered optimizer state
// must be the same bits. The layers are shaped so that the slices are uneven: a (13, 7) weight of 91 elements in
// 8-bit blocks of 64 (rank 0 has one block, rank 1 27 elements) and a bias of 13 that rank 1 has none of.
struct ZeroRun {
  std::vector<Tensor> params;
  StateDict state;
  std::vector<double> norms;  // with explicit_clip: what clip_grad_norm_ returned at each step
};

// `explicit_clip`: each step clips to a norm of 0.05 (which binds) with clip_grad_norm_ on amp::master_params at even
// steps and on the optimizer at odd ones, instead of unscale_clip_.
ZeroRun train_zero(int stage, bool eight_bit, bool bf16, bool compress, bool explicit_clip = false) {
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(7, 13));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Linear>(13, 5));
  nn::DDPOptions o;
  o.reduce_scatter = stage >= 2;
  if (compress) o.compression = DType::BFloat16;
  std::unique_ptr<optim::Optimizer> opt;
  if (eight_bit)
    opt = std::make_unique<optim::AdamW8bit>(
        model->parameters(), optim::AdamW8bitOptions{.lr = 0.01, .block_size = 64, .min_8bit_size = 32});
  else
    opt = optim::make_adamw(model->parameters(), optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1});
  o.shard_alignment = opt->shard_alignment();
  auto ddp = std::make_shared<nn::DistributedDataParallel>(model, o);
  auto amp = amp::initialize(*model, {opt.get()}, bf16 ? amp::OptLevel::O2 : amp::OptLevel::O0, DType::BFloat16);
  if (stage >= 1) opt->shard(&dist::default_group());
  std::vector<double> norms;
  for (int step = 0; step < 4; ++step) {
    Generator gen(100 * step + dist::rank());
    const Tensor x = randn({6, 7}, DType::Float32, &gen);
    const Tensor y = tensor({1, 2, 3, 4, 0, static_cast<double>(step)}, DType::Int64);
    opt->zero_grad();
    Tensor loss;
    {
      auto fw = amp->forward();
      loss = F::cross_entropy((*ddp)(x).float_(), y);
    }
    amp->scale_loss(loss, *opt).backward();
    if (stage >= 2) {  // the optimizer reads each rank's slice of the gradients (as castor train does)
      const auto slices = ddp->shard_grads();
      for (size_t i = 0; i < opt->param_groups()[0].slots.size(); ++i)
        for (const auto& [p, g] : slices)
          if (p.is_same(opt->param_groups()[0].slots[i].param)) opt->stage_float32_grad(0, i, g);
    }
    if (!explicit_clip)
      amp->unscale_clip_(*opt, /*max_norm=*/100.0);  // (the norm is far below: the coefficient is exactly 1)
    else
      norms.push_back(step % 2 == 0 ? amp::clip_grad_norm_(amp::master_params(*opt), 0.05)
                                    : amp::clip_grad_norm_(*opt, 0.05));
    amp->step(*opt);
  }
  ZeroRun r;
  r.norms = norms;
  for (const Tensor& p : model->parameters()) r.params.push_back(p.detach().clone());
  r.state = opt->state_dict();
  for (const auto& [k, t] : amp->model_state_dict()) r.state["model." + k] = t;
  return r;
}

void zero_stages() {
  for (const auto [eight_bit, bf16, compress] :
       {std::tuple{false, false, false}, std::tuple{false, true, false}, std::tuple{true, false, false},
        std::tuple{true, true, false}, std::tuple{false, false, true}}) {
    const std::string what = std::string(eight_bit ? "adamw8bit" : "adamw") + (bf16 ? " O2 bf16" : " O0") +
                             (compress ? " bf16 on the wire" : "");
    const ZeroRun base = train_zero(0, eight_bit, bf16, compress);
    for (int stage : {1, 2}) {
      const ZeroRun z = train_zero(stage, eight_bit, bf16, compress);
      const std::string tag = what + " zero " + std::to_string(stage);
      for (size_t k = 0; k < base.params.size(); ++k)
        expect(same_bits(base.params[k], z.params[k]), tag + ": parameter " + std::to_string(k));
      expect(base.state.size() == z.state.size(), tag + ": state keys");
      for (const auto& [key, t] : base.state)
        expect(z.state.count(key) && same_bits(t, z.state.at(key)), tag + ": " + key + " gathered");
    }
  }
}

// clip_grad_norm_ and amp::master_params on a sharded optimizer: each rank sums its slices, the sums are all-reduced,
// so the norm is the replicated run's (up to the order of the float64 additions) and, clipped by the same
// coefficient, the weights agree with the replicated run's to float32 rounding. Except at O2 bfloat16 with stage 2:
// clip_grad_norm_(optimizer) scales the replicated run's bfloat16 .grad in bfloat16 but stage 2's float32 slices in
// float32, so there the runs part by bfloat16 rounding (a norm of one rank's slices alone would be ~30% off).
void zero_clip() {
  auto close = [](const Tensor& a, const Tensor& b, double rel) {
    return max(abs(sub(a.to(DType::Float64), b.to(DType::Float64)))).item() <=
           rel * (1 + max(abs(b.to(DType::Float64))).item());
  };
  for (const bool bf16 : {false, true}) {
    const ZeroRun base = train_zero(0, false, bf16, false, /*explicit_clip=*/true);
    for (int stage : {1, 2}) {
      const ZeroRun z = train_zero(stage, false, bf16, false, true);
      const std::string tag = std::string(bf16 ? "O2 bf16" : "O0") + " zero " + std::to_string(stage);
      const bool rounded = bf16 && stage == 2;
      expect(base.norms.size() == 4 && z.norms.size() == 4, tag + ": norms returned");
      for (size_t k = 0; k < base.norms.size() && k < z.norms.size(); ++k)
        expect(base.norms[k] > 0.05 && std::abs(z.norms[k] - base.norms[k]) <= (rounded ? 1e-2 : 1e-9) * base.norms[k],
               tag + ": the norm at step " + std::to_string(k) + " is " + std::to_string(z.norms[k]) + ", replicated " +
                   std::to_string(base.norms[k]));
      for (size_t k = 0; k < base.params.size(); ++k)
        expect(close(z.params[k], base.params[k], rounded ? 1e-2 : 1e-5), tag + ": parameter " + std::to_string(k));
    }
  }
}

// A Llama of 16 blocks of 128 built under nn::BlockInitGuard, each block handed to nn::ShardedBlocks::add (rank 0's
// values broadcast, each rank's slice kept) as it is drawn: gathered, its weights are those of the same model built
// whole, bit for bit, and the allocator's peak while it was built is at most its slices, the rest of the model and
// one whole block (within 10%: the allocator's rounding; built whole, half the blocks more). Then a sharded checkpoint whose model is a
// Checkpoint::model_each (each block weight gathered only as rank 0 writes it): its model file reads back as the
// whole model's state dict bit for bit, and writing it took at most two tensors' bytes above what was held (gathering
// the blocks whole for it took the other ranks' slices of all of them).
void zero3_build_and_write(const std::string& dir) {
  dist::ProcessGroup& group = dist::default_group();
  models::LlamaConfig c = models::llama_preset("llama", 64);
  c.n_layers = 16;
  const StateDict want = models::llama(c, 7)->state_dict();
  double blocks = 0, block = 0, largest = 0;  // bytes: all blocks, one, the largest tensor
  for (const auto& [name, t] : want) {
    largest = std::max(largest, static_cast<double>(t.nbytes()));
    if (name.rfind("layers.", 0) == 0) blocks += static_cast<double>(t.nbytes());
  }
  block = blocks / 16;
  auto zero3 = std::make_shared<nn::ShardedBlocks>(group, 1);
  const int64_t before = memory_stats().current_bytes;
  reset_peak_memory_stats();
  std::shared_ptr<models::Llama> model;
  {
    nn::BlockInitGuard sharded([&](nn::Module& b) { zero3->add(zero3->size(), b.parameters(), /*broadcast=*/true); });
    model = models::llama(c, 7);
  }
  const double built = static_cast<double>(memory_stats().peak_bytes - before);
  const double kept = static_cast<double>(memory_stats().current_bytes - before);  // the slices and the rest
  expect(zero3->size() == 16, "zero3build: " + std::to_string(zero3->size()) + " blocks sharded, expected 16");
  expect(built <= kept + 1.1 * block, "zero3build: the peak while building, " + std::to_string(built) +
                                          " bytes, passes the slices and the rest, " + std::to_string(kept) +
                                          ", and a block, " + std::to_string(block));
  std::map<const Storage*, Tensor> param_of;  // (by storage: state_dict's views share it)
  for (const auto& [name, p] : model->named_parameters()) param_of[p.impl()->storage.get()] = p;
  train::Checkpoint ck;
  for (const auto& [name, t] : model->state_dict()) {
    const Tensor p = param_of.at(t.impl()->storage.get());
    const bool sharded = zero3->holds(p);
    expect(same_bits(sharded ? zero3->whole(p) : t, want.at(name)),
           "zero3build: " + name + " differs from the whole model's");
    ck.model_each.push_back(
        {name, t.dtype(), t.shape(), [zero3, p, t, sharded] { return sharded ? zero3->whole(p) : t; }});
  }
  ck.shard["x"] = tensor({static_cast<double>(dist::rank())}, {1}, DType::Float32);
  ck.shard_where["x"] = {{2}, dist::rank()};
  const int64_t held = memory_stats().current_bytes;
  reset_peak_memory_stats();
  train::write_sharded_checkpoint(dir, 1, ck, 1, group);
  const double writing = static_cast<double>(memory_stats().peak_bytes - held);
  expect(writing <= 2 * largest, "zero3build: writing the checkpoint took " + std::to_string(writing) +
                                     " bytes above what was held, more than two tensors' " +
                                     std::to_string(2 * largest));
  group.barrier();
  const train::Checkpoint read = train::read_checkpoint(dir);
  expect(read.model.size() == want.size(),
         "zero3build: the model file holds " + std::to_string(read.model.size()) + " tensors");
  for (const auto& [name, t] : want)
    expect(read.model.count(name) && same_bits(read.model.at(name), t), "zero3build: the file's " + name + " differs");
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
    else if (mode == "zero")
      zero_stages();
    else if (mode == "zeroclip")
      zero_clip();
    else if (mode == "zero3build")
      zero3_build_and_write(argc > 2 ? argv[2] : ".");
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
