// The training steps of `castor train`'s two default jobs at each precision, side by side in one process (issue #33):
// SimpleCNN on 1x28x28 images, batch 64, Adam; nanoGPT's CPU GPT (4 layers, 4 heads, 128 wide, block 64, batch 12,
// 85-character vocabulary), AdamW and clipping at 1.0. One model per level; the levels take turns step by step
// after two warm-up steps each, so a shared machine's drifting load falls on all of them; each figure is the median
// over the steps of the process CPU time (user + system of all threads: the steadier measure on a loaded machine)
// and of the wall time, and each level's ratio to O0 (> 1: slower). Run with OMP_WAIT_POLICY=passive (waiting
// threads then cost no CPU time) and, for an AVX2-only CPU, ONEDNN_MAX_CPU_ISA=AVX2.
//
//   precision_step_bench [cnn|gpt|all] [STEPS=30] [LEVELS=all]   (LEVELS: a comma list of O0, bf16, fp16; one
//                                                                 level alone is for a profiler)
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "castor/amp.h"
#include "castor/backends.h"
#include "castor/functional.h"
#include "castor/models.h"

using namespace castor;

namespace {

// One opt level's model, optimizer, loop helper and batch: step() runs one training step.
struct Run {
  std::string name;
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<amp::Amp> amp;
  std::function<Tensor()> loss;  // the forward pass and loss, under amp's forward scope
  double clip = 0;
  std::vector<double> cpu, wall;

  void step() {
    Tensor l;
    {
      auto scope = amp->forward();
      l = loss();
    }
    amp->scale_loss(l, *opt).backward();
    if (clip > 0) amp::clip_grad_norm_(*opt, clip);
    opt->step();
    opt->zero_grad();
  }
};

struct Level {
  const char* name;
  amp::OptLevel level;
  DType dtype;
};
const Level kLevels[] = {{"O0", amp::OptLevel::O0, DType::BFloat16},
                         {"bf16", amp::OptLevel::O1, DType::BFloat16},
                         {"fp16", amp::OptLevel::O1, DType::Float16}};

std::unique_ptr<Run> cnn_run(const Level& lv) {
  auto r = std::make_unique<Run>();
  r->name = lv.name;
  auto model = models::simple_cnn(1, 28, 28, 10);
  r->model = model;
  r->opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{});
  r->amp = amp::initialize(*model, {r->opt.get()}, lv.level, lv.dtype);
  const Tensor x = randn({64, 1, 28, 28}), y = randint(0, 10, {64});
  r->loss = [model, x, y] { return F::cross_entropy((*model)(x), y); };
  return r;
}

std::unique_ptr<Run> gpt_run(const Level& lv) {
  auto r = std::make_unique<Run>();
  r->name = lv.name;
  models::GPTConfig c;
  c.n_layer = 4, c.n_head = 4, c.n_embd = 128, c.block_size = 64, c.vocab_size = 85, c.dropout = 0.0;
  auto model = models::gpt(c, 1);
  r->model = model;
  optim::AdamOptions o = optim::AdamOptions::adamw();
  o.lr = 1e-3, o.weight_decay = 0.1, o.beta2 = 0.99;
  r->opt = bench::decayed_adamw(*model, o);
  r->amp = amp::initialize(*model, {r->opt.get()}, lv.level, lv.dtype);
  r->clip = 1.0;
  const Tensor x = randint(0, c.vocab_size, {12, 64}), y = randint(0, c.vocab_size, {12, 64});
  r->loss = [model, x, y, c] { return F::cross_entropy((*model)(x).reshape({-1, c.vocab_size}), y.reshape({-1})); };
  return r;
}

void bench_job(const char* job, int steps, const std::string& levels) {
  std::vector<std::unique_ptr<Run>> runs;
  for (const Level& lv : kLevels)
    if (levels == "all" || ("," + levels + ",").find(std::string(",") + lv.name + ",") != std::string::npos)
      runs.push_back(std::string(job) == "cnn" ? cnn_run(lv) : gpt_run(lv));
  for (int i = 0; i < steps + 2; ++i)
    for (auto& r : runs) {
      const double c0 = bench::clock_seconds(CLOCK_PROCESS_CPUTIME_ID), w0 = bench::clock_seconds(CLOCK_MONOTONIC);
      r->step();
      if (i < 2) continue;
      r->cpu.push_back(bench::clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - c0);
      r->wall.push_back(bench::clock_seconds(CLOCK_MONOTONIC) - w0);
    }
  const double cpu0 = bench::median(runs[0]->cpu), wall0 = bench::median(runs[0]->wall);
  for (auto& r : runs) {
    const double cpu = bench::median(r->cpu), wall = bench::median(r->wall);
    std::printf("%-4s %-5s cpu %7.2f ms (%.3fx %s)   wall %7.2f ms (%.3fx)\n", job, r->name.c_str(), 1e3 * cpu,
                cpu / cpu0, runs[0]->name.c_str(), 1e3 * wall, wall / wall0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 30;
  const std::string levels = argc > 3 ? argv[3] : "all";
  if ((which != "cnn" && which != "gpt" && which != "all") || steps < 1) {
    std::fprintf(stderr, "usage: precision_step_bench [cnn|gpt|all] [STEPS] [LEVELS: O0,bf16,fp16]\n");
    return 2;
  }
  std::printf("# %s; bf16 dot units: %s; %d threads; %d steps a level, levels interleaved, medians\n",
              bench::cpu_isa().c_str(), backends::bf16_dot_units() ? backends::bf16_dot_units() : "none",
              omp_get_max_threads(), steps);
  for (const char* job : {"cnn", "gpt"})
    if (which == "all" || which == job) bench_job(job, steps, levels);
  return 0;
}
