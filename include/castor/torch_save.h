// torch.save's file format, written without PyTorch: a zip archive (stored, 64-byte aligned records) holding
// data.pkl (pickle protocol 2), one record per tensor storage and version, which torch.load reads.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "castor/tensor.h"

namespace castor {

// A Python value as torch.save pickles it: None, bool, int, str, tensor (contiguous copies of float32, float64,
// float16, bfloat16 and int64 tensors, stored once however often they appear: tied weights stay tied), list, tuple
// and dict (keys in the order given). There is no float: PyTorch 1.13's weights_only unpickler has no float
// opcode, so a number is a 0-d tensor, which torch and nanoGPT use as a number.
class PyValue {
 public:
  enum class Kind { None, Bool, Int, String, Tensor, List, Tuple, Dict };
  PyValue() = default;  // None
  static PyValue boolean(bool v);
  static PyValue integer(int64_t v);
  static PyValue string(std::string v);
  static PyValue tensor(Tensor v);
  static PyValue list(std::vector<PyValue> items);
  static PyValue tuple(std::vector<PyValue> items);
  static PyValue dict(std::vector<std::pair<PyValue, PyValue>> items);
  // A dict with string keys.
  static PyValue dict(std::vector<std::pair<std::string, PyValue>> items);

  Kind kind() const { return kind_; }

 private:
  friend class Pickler;
  Kind kind_ = Kind::None;
  bool bool_ = false;
  int64_t int_ = 0;
  std::string string_;
  Tensor tensor_;
  std::vector<PyValue> items_;  // list and tuple elements; a dict's keys and values, alternating
};

// Writes `value` as torch.save(value, path) would (the zip format of PyTorch >= 1.6, records under the file's stem,
// as torch names them), whole: temp file, fsync, rename, so a failure leaves any old file as it was. castor::Error
// naming the path on a tensor of another dtype, an archive over 4 GiB (no zip64), or a failed write.
void torch_save(const std::string& path, const PyValue& value);

}  // namespace castor
