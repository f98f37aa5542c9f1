// --profile: an op observer that totals time per op, direction and dtype, and prints the top entries.
#pragma once
#include <map>
#include <string>
#include <tuple>

#include "runtime/dispatch.h"

namespace castor::train {

class Profiler : public OpObserver {
 public:
  Profiler() : prev_(op_observer()) { set_op_observer(this); }
  ~Profiler() override { set_op_observer(prev_); }
  void on_op(const OpEvent& e) override;
  std::string table(size_t top) const;  // the `top` entries by total time

 private:
  struct Total {
    double seconds = 0;
    int64_t calls = 0;
  };
  OpObserver* prev_;
  std::map<std::tuple<std::string, bool, std::string>, Total> totals_;  // (op, backward, dtypes)
};

}  // namespace castor::train
