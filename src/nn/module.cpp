// nn::Module: the registry of parameters, buffers and children, modes, dtype conversion and state dicts.
#include <algorithm>
#include <set>
#include <sstream>

#include "castor/autograd.h"
#include "castor/nn.h"

namespace castor::nn {

namespace {

// Points `dst`'s TensorImpl at `src`'s data (PyTorch's `param.data = src`): holders of `dst` see the change.
void set_data(const Tensor& dst, const Tensor& src) {
  TensorImpl& d = *dst.impl();
  const TensorImpl& s = *src.impl();
  d.storage = s.storage;
  d.shape = s.shape;
  d.strides = s.strides;
  d.offset = s.offset;
  d.dtype = s.dtype;
}

// Casts a floating tensor (and its gradient) in place; leaves other dtypes alone.
void cast_floating(const Tensor& t, DType dtype) {
  if (!is_floating(t.dtype()) || t.dtype() == dtype) return;
  CASTOR_ASSERT(t.numel() == 0 || t.impl()->storage->nbytes > 0, "Module::to: ", t.describe(),
                " holds no storage (a ZeRO-3 parameter is cast before it is sharded: amp::cast_parameters)");
  set_data(t, t.detach().to(dtype));
  if (Tensor g = t.grad(); g.defined()) set_data(g, g.to(dtype));
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s;
}

}  // namespace

void Module::check_new_name(const std::string& name, const char* what) const {
  CASTOR_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name(), ": ", what, " name \"", name,
               "\" must be non-empty and contain no '.'");
  auto taken = [&](const auto& entries) {
    return std::any_of(entries.begin(), entries.end(), [&](const auto& e) { return e.first == name; });
  };
  CASTOR_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), type_name(), ": cannot register ", what,
               " \"", name, "\": the name is already taken");
}

Tensor Module::register_parameter(const std::string& name, const Tensor& value) {
  check_new_name(name, "parameter");
  CASTOR_CHECK(value.defined() && is_floating(value.dtype()), type_name(), ": parameter \"", name,
               "\" must be a defined floating-point tensor");
  Tensor p = value.detach();
  p.requires_grad_(true);
  parameters_.emplace_back(name, p);
  return p;
}

Tensor Module::tie_parameter(const std::string& name, const Tensor& parameter) {
  auto it = std::find_if(parameters_.begin(), parameters_.end(), [&](const auto& e) { return e.first == name; });
  CASTOR_CHECK(it != parameters_.end(), type_name(), ": no parameter \"", name, "\" to tie");
  CASTOR_CHECK(parameter.defined() && parameter.is_leaf() && parameter.requires_grad() &&
                   parameter.shape() == it->second.shape(),
               type_name(), ": parameter \"", name, "\" ", it->second.describe(),
               " can only be tied to a registered parameter of its shape");
  it->second = parameter;
  return parameter;
}

Tensor Module::register_buffer(const std::string& name, const Tensor& value) {
  check_new_name(name, "buffer");
  CASTOR_CHECK(value.defined(), type_name(), ": buffer \"", name, "\" must be a defined tensor");
  Tensor b = value.detach();
  buffers_.emplace_back(name, b);
  return b;
}

void Module::add_child(const std::string& name, ModulePtr module) {
  check_new_name(name, "module");
  CASTOR_CHECK(module != nullptr, type_name(), ": module \"", name, "\" is null");
  children_.emplace_back(name, std::move(module));
}

void Module::unregister_module(const std::string& name) {
  auto it = std::find_if(children_.begin(), children_.end(), [&](const auto& e) { return e.first == name; });
  CASTOR_CHECK(it != children_.end(), type_name(), ": no module \"", name, "\" to remove");
  children_.erase(it);
}

void Module::unregister_parameter(const std::string& name) {
  auto it = std::find_if(parameters_.begin(), parameters_.end(), [&](const auto& e) { return e.first == name; });
  CASTOR_CHECK(it != parameters_.end(), type_name(), ": no parameter \"", name, "\" to remove");
  parameters_.erase(it);
}

void Module::collect(const std::string& prefix, bool params, bool buffers, bool recurse, NamedTensors& out) const {
  if (params)
    for (const auto& [name, t] : parameters_) out.emplace_back(prefix + name, t);
  if (buffers)
    for (const auto& [name, t] : buffers_) out.emplace_back(prefix + name, t);
  if (recurse)
    for (const auto& [name, child] : children_) child->collect(prefix + name + ".", params, buffers, true, out);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors all, out;
  collect("", /*params=*/true, /*buffers=*/false, recurse, all);
  std::set<const TensorImpl*> seen;  // a tied parameter once, under its first name (PyTorch's remove_duplicate)
  for (auto& entry : all)
    if (seen.insert(entry.second.impl()).second) out.push_back(std::move(entry));
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", /*params=*/false, /*buffers=*/true, recurse, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<ModulePtr> Module::children() const {
  std::vector<ModulePtr> out;
  for (const auto& [name, child] : children_) out.push_back(child);
  return out;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (const auto& [name, child] : children_) child->apply(fn);
  fn(*this);
  return *this;
}

Module& Module::train(bool mode) {
  return apply([mode](Module& m) { m.training_ = mode; });
}

Tensor Module::forward(const std::vector<Tensor>& inputs) {
  CASTOR_CHECK(inputs.size() == 1, type_name(), ": forward takes one input, got ", inputs.size());
  return forward(inputs[0]);
}

Tensor Module::operator()(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> xs = inputs;
  for (const ForwardHook& h : forward_pre_hooks_)
    for (Tensor& x : xs)
      if (Tensor r = x.defined() ? h(x) : Tensor(); r.defined()) x = r;
  Tensor y = forward(xs);
  for (const ForwardHook& h : forward_hooks_)
    if (Tensor r = h(y); r.defined()) y = r;
  return y;
}

Tensor Module::operator()(const Tensor& input) {
  Tensor x = input;
  for (const ForwardHook& h : forward_pre_hooks_)
    if (Tensor r = h(x); r.defined()) x = r;
  Tensor y = forward(x);
  for (const ForwardHook& h : forward_hooks_)
    if (Tensor r = h(y); r.defined()) y = r;
  return y;
}

Module& Module::to(DType dtype, bool keep_norms_fp32, bool frozen_only) {
  NoGradGuard no_grad;
  return apply([&](Module& m) {
    if (keep_norms_fp32 && m.keeps_fp32_params()) return;
    for (const auto& [name, p] : m.parameters_)
      if (!frozen_only || !p.requires_grad()) cast_floating(p, dtype);
    if (!frozen_only)
      for (const auto& [name, b] : m.buffers_) cast_floating(b, dtype);
  });
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none)
      p.set_grad(Tensor());
    else
      g.detach().zero_();
  }
}

StateDict Module::state_dict() const {
  NamedTensors entries;
  collect("", /*params=*/true, /*buffers=*/true, /*recurse=*/true, entries);
  StateDict sd;
  for (const auto& [name, t] : entries) sd.emplace(name, t.detach());
  return sd;
}

LoadResult Module::load_state_dict(const StateDict& state_dict, bool strict) {
  NamedTensors own;
  collect("", /*params=*/true, /*buffers=*/true, /*recurse=*/true, own);
  LoadResult result;
  std::vector<std::string> mismatches;
  std::set<std::string> own_names;
  std::set<const TensorImpl*> loaded;  // a tied parameter is loaded by any of its names
  for (const auto& [name, t] : own)
    if (state_dict.count(name)) loaded.insert(t.impl());
  for (const auto& [name, t] : own) {
    own_names.insert(name);
    auto it = state_dict.find(name);
    if (it == state_dict.end()) {
      if (!loaded.count(t.impl())) result.missing_keys.push_back(name);
      continue;
    }
    const Tensor& v = it->second;
    if (v.shape() != t.shape())
      mismatches.push_back("size mismatch for " + name + ": copying a param with shape " + shape_str(v.shape()) +
                           " from checkpoint, the shape in current model is " + shape_str(t.shape()) + ".");
    else if (is_floating(v.dtype()) != is_floating(t.dtype()))
      mismatches.push_back("dtype mismatch for " + name + ": copying a " + dtype_name(v.dtype()) +
                           " tensor from checkpoint, the dtype in current model is " + dtype_name(t.dtype()) + ".");
  }
  for (const auto& [name, v] : state_dict)
    if (!own_names.count(name)) result.unexpected_keys.push_back(name);

  std::ostringstream errors;
  if (strict && !result.missing_keys.empty())
    errors << "\n\tMissing key(s) in state_dict: " << quoted_list(result.missing_keys) << ".";
  if (strict && !result.unexpected_keys.empty())
    errors << "\n\tUnexpected key(s) in state_dict: " << quoted_list(result.unexpected_keys) << ".";
  for (const std::string& m : mismatches) errors << "\n\t" << m;
  CASTOR_CHECK(errors.str().empty(), "Error(s) in loading state_dict for ", type_name(), ":", errors.str());

  NoGradGuard no_grad;
  for (const auto& [name, t] : own)
    if (auto it = state_dict.find(name); it != state_dict.end()) t.detach().copy_(it->second);
  return result;
}

}  // namespace castor::nn
