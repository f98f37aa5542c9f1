// AdamW with block-wise 8-bit moments (bitsandbytes' AdamW8bit), and converting its state to and from AdamW's.
#include <algorithm>
#include <cmath>

#include "castor/optim.h"
#include "core/parallel.h"
#include "optim/adam_scalars.h"
#include "optim/write_back.h"

namespace castor::optim {

namespace {

constexpr const char* kCode[2] = {"exp_avg_code", "exp_avg_sq_code"};
constexpr const char* kAbsmax[2] = {"exp_avg_absmax", "exp_avg_sq_absmax"};
constexpr const char* kFloat[2] = {"exp_avg", "exp_avg_sq"};

int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }

// The code of 0 in a dynamic map.
uint8_t zero_code(bool is_signed) {
  const float* map = kernels::dynamic_map(is_signed);
  return static_cast<uint8_t>(std::find(map, map + 256, 0.0f) - map);
}

// The slot-state keys "state.<g>.<i>." of a dict that have `name`, as prefixes.
std::vector<std::string> prefixes_with(const StateDict& sd, const std::string& name) {
  std::vector<std::string> out;
  const std::string suffix = "." + name;
  for (const auto& [key, t] : sd)
    if (key.rfind("state.", 0) == 0 && key.size() > suffix.size() &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(key.substr(0, key.size() - name.size()));
  return out;
}

}  // namespace

void AdamW8bitOptions::validate() const {
  AdamOptions{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay}.validate();
  CASTOR_CHECK(block_size > 0 && (block_size & (block_size - 1)) == 0, "AdamW8bit: invalid block_size ", block_size,
               " (must be a positive power of two)");
  CASTOR_CHECK(min_8bit_size >= 0, "AdamW8bit: invalid min_8bit_size ", min_8bit_size, " (must be >= 0)");
}

AdamW8bit::AdamW8bit(const std::vector<Tensor>& params, AdamW8bitOptions options) : options_(options) {
  options_.validate();
  add_param_group(params, options_.lr, options_.weight_decay);
}

bool AdamW8bit::is_8bit(const Shape& shape, const AdamW8bitOptions& options) {
  return shape.size() >= 2 && shape_numel(shape) >= options.min_8bit_size;
}

std::string AdamW8bit::state_layout(const ParamSlot& slot, const std::string& name, DType& dtype, Shape& shape) const {
  const bool eight = is_8bit(slot.param.shape(), options_);
  const bool code = name == kCode[0] || name == kCode[1], absmax = name == kAbsmax[0] || name == kAbsmax[1];
  if (eight && (name == kFloat[0] || name == kFloat[1]))
    return detail::cat("a 32-bit AdamW state, but adamw8bit keeps this ", slot.param.describe(),
                       " parameter's moments in 8 bits (convert the dict with adamw_state_to_8bit)");
  if (!eight && (code || absmax))
    return detail::cat("an 8-bit state, but adamw8bit keeps this ", slot.param.describe(),
                       " parameter's moments in float32 (fewer than ", options_.min_8bit_size,
                       " elements or one dimension)");
  dtype = code ? DType::UInt8 : DType::Float32;
  shape = name == "step" ? Shape{}
          : absmax       ? Shape{blocks_of(slot.param.numel(), options_.block_size)}
                         : slot.param.shape();
  return "";
}

void AdamW8bit::load_state_dict(const StateDict& sd) {
  // A moment's code comes with its absmax (the base checks each tensor's layout).
  for (int k = 0; k < 2; ++k)
    for (const char* have : {kCode[k], kAbsmax[k]}) {
      const char* other = have == kCode[k] ? kAbsmax[k] : kCode[k];
      for (const std::string& prefix : prefixes_with(sd, have))
        CASTOR_CHECK(sd.count(prefix + other), "load_state_dict: \"", prefix, have, "\" without \"", prefix, other,
                     "\"");
    }
  Optimizer::load_state_dict(sd);
}

// step += 1; the scalars of AdamW's step; a 32-bit slot updated by AdamW's kernel, an 8-bit one by
// kernels::adamw8bit_update over units of whole quantisation blocks (and whole kBlocks for the write-back).
BlockPass AdamW8bit::update(ParamGroup& group, ParamSlot& slot, Tensor& w, const Tensor& g) {
  Tensor& step = slot.state["step"];
  if (!step.defined()) step = zeros({});
  step.data<float>()[0] += 1.0f;
  kernels::AdamUpdate u = adam_scalars({options_.beta1, options_.beta2, options_.eps, /*decoupled=*/true}, group.lr,
                                       group.weight_decay, step.data<float>()[0]);
  u.grad_inv_scale = grad_inv_scale_;
  u.grad_clip = grad_clip_;
  float* wp = w.data<float>();
  const float* gp = g.data<float>();
  if (!is_8bit(slot.param.shape(), options_)) {  // (w is a slice of it when sharded)
    float* m[2];
    for (int k = 0; k < 2; ++k) {
      Tensor& t = slot.state[kFloat[k]];
      if (!t.defined()) t = zeros(w.shape());
      m[k] = t.data<float>();
    }
    return {w.numel(), kBlock, [u, wp, gp, m0 = m[0], m1 = m[1], wb = take_write_back()](int64_t b, int64_t e) {
              kernels::adam_update(u, b, e, wp, gp, m0, m1, nullptr, round_into(wb));
            }};
  }
  uint8_t* code[2];
  float* absmax[2];
  for (int k = 0; k < 2; ++k) {
    Tensor& c = slot.state[kCode[k]];
    Tensor& a = slot.state[kAbsmax[k]];
    if (!c.defined() || !a.defined()) {
      c = full(w.shape(), zero_code(k == 0), DType::UInt8);
      a = zeros({blocks_of(w.numel(), options_.block_size)});
    }
    code[k] = c.data<uint8_t>();
    absmax[k] = a.data<float>();
  }
  const int64_t block = options_.block_size;
  return {w.numel(), std::max(block, kBlock),
          [u, wp, gp, block, code, absmax, wb = take_write_back()](int64_t b, int64_t e) {
            kernels::adamw8bit_update(u, b, e, block, wp, gp, code[0], absmax[0], code[1], absmax[1], round_into(wb));
          }};
}

StateDict adamw_state_to_8bit(const StateDict& sd, const AdamW8bitOptions& options) {
  options.validate();
  CASTOR_CHECK(prefixes_with(sd, kCode[0]).empty(), "adamw_state_to_8bit: the state is already 8-bit (", kCode[0], ")");
  CASTOR_CHECK(prefixes_with(sd, "max_exp_avg_sq").empty(),
               "adamw_state_to_8bit: the state is AMSGrad's (max_exp_avg_sq), which adamw8bit does not keep");
  StateDict out = sd;
  for (const std::string& prefix : prefixes_with(sd, kFloat[0])) {
    const Tensor& m = sd.at(prefix + kFloat[0]);
    auto v = sd.find(prefix + kFloat[1]);
    CASTOR_CHECK(v != sd.end() && v->second.shape() == m.shape() && m.dtype() == DType::Float32 &&
                     v->second.dtype() == DType::Float32,
                 "adamw_state_to_8bit: \"", prefix, kFloat[0], "\" without a float32 \"", prefix, kFloat[1],
                 "\" of its shape");
    if (!AdamW8bit::is_8bit(m.shape(), options)) continue;
    for (int k = 0; k < 2; ++k) {
      const Tensor x = sd.at(prefix + kFloat[k]).contiguous();
      Tensor code = empty(x.shape(), DType::UInt8), absmax = empty({blocks_of(x.numel(), options.block_size)});
      kernels::quantize_blockwise(x.data<float>(), x.numel(), options.block_size, k == 0, code.data<uint8_t>(),
                                  absmax.data<float>());
      out.erase(prefix + kFloat[k]);
      out[prefix + kCode[k]] = code;
      out[prefix + kAbsmax[k]] = absmax;
    }
  }
  return out;
}

StateDict adamw8bit_state_to_32bit(const StateDict& sd) {
  StateDict out = sd;
  for (int k = 0; k < 2; ++k)
    for (const std::string& prefix : prefixes_with(sd, kCode[k])) {
      const Tensor code = sd.at(prefix + kCode[k]).contiguous();
      auto a = sd.find(prefix + kAbsmax[k]);
      CASTOR_CHECK(code.dtype() == DType::UInt8 && a != sd.end() && a->second.dtype() == DType::Float32 &&
                       a->second.dim() == 1 && a->second.numel() > 0,
                   "adamw8bit_state_to_32bit: \"", prefix, kCode[k], "\" is not uint8 codes with a float32 \"", prefix,
                   kAbsmax[k], "\"");
      // The block size: the power of two giving that many blocks (any at least numel for one block).
      const int64_t n = code.numel(), blocks = a->second.numel();
      int64_t block = 1;
      while (blocks_of(n, block) > blocks) block *= 2;
      CASTOR_CHECK(blocks_of(n, block) == blocks, "adamw8bit_state_to_32bit: \"", prefix, kAbsmax[k], "\" has ", blocks,
                   " blocks, which no power-of-two block size gives for ", n, " elements");
      const Tensor absmax = a->second.contiguous();
      Tensor x = empty(code.shape());
      kernels::dequantize_blockwise(code.data<uint8_t>(), absmax.data<float>(), n, block, k == 0, x.data<float>());
      out.erase(prefix + kCode[k]);
      out.erase(prefix + kAbsmax[k]);
      out[prefix + kFloat[k]] = x;
    }
  return out;
}

}  // namespace castor::optim
