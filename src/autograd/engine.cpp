// The backward engine: grad mode, recording nodes, and running the graph in reverse creation order.
#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/node.h"
#include "castor/autograd.h"
#include "castor/convert.h"
#include "castor/ops.h"
#include "runtime/dispatch.h"

namespace castor {

namespace {
thread_local bool g_grad_enabled = true;
thread_local int g_backward_depth = 0;                        // backward calls in progress on this thread
thread_local std::vector<std::function<void()>> g_callbacks;  // queued for the end of the outermost one
thread_local bool g_plain_accumulation = false;  // the running backward adds leaf gradients into .grad in place
std::atomic<uint64_t> g_sequence{0};
}  // namespace

bool GradMode::is_enabled() { return g_grad_enabled; }
void GradMode::set_enabled(bool enabled) { g_grad_enabled = enabled; }

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Tensor Node::unpack(const SavedTensor& s) const {
  CASTOR_CHECK(!released, "backward through the graph a second time (", op_name(op),
               "): its saved tensors were freed; pass retain_graph=true to the first backward");
  const Tensor& y = s.tensor;
  CASTOR_CHECK(!y.defined() || y.version() == s.version,
               "one of the tensors needed for gradient computation has "
               "been modified by an in-place operation: the ",
               y.describe(), " saved by ", op_name(op), " is at version ", y.version(), "; expected version ",
               s.version);
  if (!s.output || !y.defined() || !GradMode::is_enabled()) return y;
  auto impl = std::make_shared<TensorImpl>(*y.impl());
  impl->grad_fn = std::const_pointer_cast<Node>(shared_from_this());
  return Tensor(std::move(impl));
}

void record(OpKind op, const std::vector<Tensor>& inputs, const Tensor& out) {
  if (!GradMode::is_enabled() || !any_requires_grad(inputs)) return;
  auto node = std::make_shared<Node>();
  node->op = op;
  node->sequence = g_sequence++;
  for (const Tensor& t : inputs) {
    Edge e;
    if (t.requires_grad()) {
      if (t.is_leaf())
        e.leaf = t.impl_ptr();
      else
        e.fn = t.grad_fn();
    }
    node->next.push_back(std::move(e));
    node->input_dtypes.push_back(t.dtype());
    node->input_shapes.push_back(t.shape());
  }
  node->out_dtype = out.dtype();
  node->out_shape = out.shape();
  out.impl()->grad_fn = std::move(node);
}

namespace {

Tensor accumulate(const Tensor& acc, const Tensor& g) { return acc.defined() ? add(acc, g) : g; }

// Runs the hooks registered on a tensor's gradient; each may replace it.
Tensor run_hooks(const std::vector<GradHook>& hooks, Tensor g) {
  for (const GradHook& h : hooks) {
    Tensor r = h(g);
    if (r.defined()) g = r;
  }
  return g;
}

// g_in is taken by value: a gradient nobody else holds becomes the leaf's .grad without a copy.
void accumulate_leaf(const std::shared_ptr<TensorImpl>& leaf, Tensor g_in, bool create_graph) {
  Tensor g = run_hooks(leaf->hooks, std::move(g_in));
  Tensor self(leaf);
  if (!leaf->grad) {
    if (create_graph) {
      self.set_grad(g);
    } else {
      // Steal a fresh gradient laid out like the leaf that nobody else holds; copy anything else into that layout.
      const bool owned = g.impl_ptr().use_count() == 1 && g.impl()->storage.use_count() == 1 && same_layout(g, self);
      self.set_grad(owned ? g.detach() : empty_like(self, g.dtype()).copy_(g));
    }
  } else if (create_graph) {
    self.set_grad(add(self.grad(), g));
  } else {
    NoGradGuard no_grad;
    Tensor acc = self.grad();
    acc.add_(g);
  }
  for (const PostAccumulateGradHook& h : leaf->post_accumulate_hooks) h(self);
}

}  // namespace

Tensor leaf_grad_to_accumulate_into(const Node& node, size_t i) {
  const Edge& e = node.next[i];
  if (!g_plain_accumulation || !e.leaf || !e.leaf->grad || !e.leaf->hooks.empty() ||
      !e.leaf->post_accumulate_hooks.empty())
    return Tensor();
  Tensor g = Tensor(e.leaf).grad();
  const bool fits = g.dtype() == node.input_dtypes[i] && g.shape() == node.input_shapes[i] && g.is_contiguous();
  return fits ? g : Tensor();
}

namespace {

// A gradient on its way to a leaf (an autocast weight's bfloat16 gradient to its float32 .grad), converted with
// streaming stores: the optimizer reads .grad only after the whole backward, long after it would have left the cache.
Tensor to_leaf_dtype(const Tensor& g, DType dtype) {
  if (!g.is_contiguous()) return g.to(dtype);
  Tensor out = empty(g.shape(), dtype);
  convert_streaming(g.data_ptr(), g.dtype(), out.data_ptr(), dtype, static_cast<size_t>(g.numel()));
  return out;
}

struct ByLatest {
  bool operator()(const Node* a, const Node* b) const { return a->sequence < b->sequence; }
};
using ReadyNodes = std::priority_queue<Node*, std::vector<Node*>, ByLatest>;  // latest first

// One run of backward: the gradients waiting at each node, how many edges have yet to deliver into each, and with
// `captures` (autograd::grad) where gradients reaching those nodes/leaves go instead of .grad.
class BackwardRun {
 public:
  BackwardRun(bool retain_graph, bool create_graph, const std::vector<Tensor>* captures, std::vector<Tensor>* captured)
      : retain_graph_(retain_graph), create_graph_(create_graph), captures_(captures), captured_(captured) {
    if (!captures) return;
    for (size_t i = 0; i < captures->size(); ++i) {
      const Tensor& t = (*captures)[i];
      CASTOR_CHECK(t.requires_grad(), "grad: input ", i, " (", t.describe(), ") does not require grad");
      capture_index_[t.is_leaf() ? static_cast<const void*>(t.impl()) : t.grad_fn().get()] = i;
    }
    captured->assign(captures->size(), Tensor());
  }

  // The outputs' gradients (ones for a scalar output given none): a leaf's is delivered, a node's waits for it.
  void seed(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Tensor& out = outputs[i];
      CASTOR_CHECK(out.requires_grad(), "backward: output ", i, " (", out.describe(),
                   ") does not require grad and has no grad_fn");
      Tensor g;
      if (grad_outputs.empty() || !grad_outputs[i].defined()) {
        CASTOR_CHECK(out.numel() == 1, "backward: grad can be implicitly created only for scalar outputs, got ",
                     out.describe());
        g = ones(out.shape(), out.dtype());
      } else {
        g = grad_outputs[i];
        CASTOR_CHECK(g.shape() == out.shape(), "backward: gradient ", g.describe(), " does not match output ",
                     out.describe());
      }
      if (out.is_leaf()) {
        deliver_leaf(out.impl_ptr(), g.to(out.dtype()));
      } else {
        Node* n = out.grad_fn().get();
        if (!buffers_.count(n)) roots_.push_back(n);
        buffers_[n] = accumulate(buffers_[n], g.to(out.dtype()));
      }
    }
  }

  // Runs the nodes, latest first, each once every edge into it has delivered.
  void run() {
    count_dependencies();
    ReadyNodes ready;
    for (Node* r : roots_)
      if (!deps_.count(r)) ready.push(r);
    OpObserver* observer = op_observer();
    while (!ready.empty()) {
      Node* node = ready.top();
      ready.pop();
      Tensor g = run_hooks(node->pre_hooks, std::move(buffers_[node]));
      buffers_.erase(node);
      capture(node, g);
      CASTOR_CHECK(!node->released, "backward through the graph a second time (", op_name(node->op),
                   "): its saved tensors were freed; pass retain_graph=true to the first backward");
      std::vector<Tensor> grads = apply(*node, std::move(g), observer);
      if (!retain_graph_) {
        if (node->state) node->state->release();
        node->released = true;
      }
      deliver(*node, grads, ready);
    }
  }

 private:
  // Counts, for each node, the edges that will deliver into it.
  void count_dependencies() {
    std::vector<Node*> stack = roots_;
    std::unordered_set<Node*> seen(roots_.begin(), roots_.end());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next) {
        if (!e.fn) continue;
        ++deps_[e.fn.get()];
        if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
      }
    }
  }

  // The node's backward rule on its gradient, reported to the op observer when there is one.
  std::vector<Tensor> apply(Node& node, Tensor g, OpObserver* observer) {
    auto start = std::chrono::steady_clock::now();
    std::vector<Tensor> grads;
    int depth;
    {
      OpNesting nesting;  // ops a rule runs are nested inside it
      depth = nesting.depth();
      // The rule owns the incoming gradient (a fused rule frees it midway), unless the observer still reports it.
      grads = apply_backward_rule(node, observer ? Tensor(g) : std::move(g));
    }
    if (observer) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::vector<Tensor> in = {g};
      Tensor out = grads.empty() ? Tensor() : grads[0];
      observer->on_op({node.op, &in, &in, &out, s, true, 0.0, depth});
    }
    CASTOR_ASSERT(grads.size() == node.next.size(), op_name(node.op), " backward returned ", grads.size(),
                  " gradients for ", node.next.size(), " inputs");
    return grads;
  }

  // The node's input gradients, in their inputs' dtypes, to the nodes they feed (queued once complete) and leaves.
  void deliver(const Node& node, std::vector<Tensor>& grads, ReadyNodes& ready) {
    for (size_t i = 0; i < grads.size(); ++i) {
      const Edge& e = node.next[i];
      if (!e.valid() || !grads[i].defined()) continue;
      Tensor gi = grads[i].dtype() == node.input_dtypes[i] ? std::move(grads[i])
                  : e.leaf && !create_graph_               ? to_leaf_dtype(grads[i], node.input_dtypes[i])
                                                           : grads[i].to(node.input_dtypes[i]);
      CASTOR_ASSERT(gi.shape() == node.input_shapes[i], op_name(node.op), " backward gave ", gi.describe(),
                    " for input ", i, " of shape ", shape_str(node.input_shapes[i]));
      if (e.fn) {
        Node* next = e.fn.get();
        buffers_[next] = accumulate(buffers_[next], gi);
        if (--deps_[next] == 0) ready.push(next);
      } else {
        deliver_leaf(e.leaf, std::move(gi));
      }
    }
  }

  void deliver_leaf(const std::shared_ptr<TensorImpl>& leaf, Tensor g) {
    if (!captures_) return accumulate_leaf(leaf, std::move(g), create_graph_);
    capture(leaf.get(), g);
  }

  // Adds g to the captured gradient of `key` (a leaf's impl or a node), if it is one of the captures.
  void capture(const void* key, const Tensor& g) {
    if (!captures_) return;
    auto it = capture_index_.find(key);
    if (it != capture_index_.end()) (*captured_)[it->second] = accumulate((*captured_)[it->second], g);
  }

  const bool retain_graph_, create_graph_;
  const std::vector<Tensor>* captures_;
  std::vector<Tensor>* captured_;
  std::unordered_map<const void*, size_t> capture_index_;
  std::unordered_map<Node*, Tensor> buffers_;
  std::unordered_map<Node*, int> deps_;
  std::vector<Node*> roots_;
};

// Runs backward from the roots. With `captures`, gradients reaching those nodes/leaves are returned instead of
// being accumulated into .grad (autograd::grad).
void run_backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, bool retain_graph,
                  bool create_graph, const std::vector<Tensor>* captures, std::vector<Tensor>* captured) {
  CASTOR_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), "backward: ", outputs.size(),
               " outputs but ", grad_outputs.size(), " gradients");
  struct Restore {
    bool prev;
    ~Restore() { GradMode::set_enabled(prev); }
  } restore{GradMode::is_enabled()};
  GradMode::set_enabled(create_graph);
  struct RestorePlain {  // a backward run from a hook has its own
    bool prev;
    ~RestorePlain() { g_plain_accumulation = prev; }
  } restore_plain{g_plain_accumulation};
  g_plain_accumulation = !captures && !create_graph;

  BackwardRun run(retain_graph, create_graph, captures, captured);
  run.seed(outputs, grad_outputs);
  run.run();
}

}  // namespace

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, bool retain_graph,
              bool create_graph) {
  struct Depth {
    Depth() { ++g_backward_depth; }
    ~Depth() {
      if (--g_backward_depth == 0) g_callbacks.clear();  // (after an error: dropped, not run)
    }
  } depth;
  run_backward(outputs, grad_outputs, retain_graph || create_graph, create_graph, nullptr, nullptr);
  if (g_backward_depth > 1) return;
  // A callback may queue another; each runs once.
  for (size_t i = 0; i < g_callbacks.size(); ++i) {
    std::function<void()> callback = std::move(g_callbacks[i]);
    callback();
  }
}

namespace autograd {

void queue_callback(std::function<void()> callback) {
  CASTOR_CHECK(g_backward_depth > 0, "autograd::queue_callback: called outside a backward pass");
  g_callbacks.push_back(std::move(callback));
}

}  // namespace autograd

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool create_graph) {
  std::vector<Tensor> result;
  run_backward(outputs, grad_outputs, retain_graph || create_graph, create_graph, &inputs, &result);
  return result;
}

}  // namespace castor
