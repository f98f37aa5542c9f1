// torch.save's zip + pickle format (include/castor/torch_save.h): a protocol-2 pickler of PyValue whose tensors are
// torch._utils._rebuild_tensor_v2 calls on persistent storages, and a zip writer of stored records.
#include "castor/torch_save.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <tuple>

#include "castor/check.h"
#include "castor/fs.h"

namespace castor {

PyValue PyValue::boolean(bool v) {
  PyValue p;
  p.kind_ = Kind::Bool, p.bool_ = v;
  return p;
}
PyValue PyValue::integer(int64_t v) {
  PyValue p;
  p.kind_ = Kind::Int, p.int_ = v;
  return p;
}
PyValue PyValue::string(std::string v) {
  PyValue p;
  p.kind_ = Kind::String, p.string_ = std::move(v);
  return p;
}
PyValue PyValue::tensor(Tensor v) {
  PyValue p;
  p.kind_ = Kind::Tensor, p.tensor_ = std::move(v);
  return p;
}
PyValue PyValue::list(std::vector<PyValue> items) {
  PyValue p;
  p.kind_ = Kind::List, p.items_ = std::move(items);
  return p;
}
PyValue PyValue::tuple(std::vector<PyValue> items) {
  PyValue p;
  p.kind_ = Kind::Tuple, p.items_ = std::move(items);
  return p;
}
PyValue PyValue::dict(std::vector<std::pair<PyValue, PyValue>> items) {
  PyValue p;
  p.kind_ = Kind::Dict;
  for (auto& [k, v] : items) p.items_.push_back(std::move(k)), p.items_.push_back(std::move(v));
  return p;
}
PyValue PyValue::dict(std::vector<std::pair<std::string, PyValue>> items) {
  std::vector<std::pair<PyValue, PyValue>> keyed;
  for (auto& [k, v] : items) keyed.emplace_back(string(k), std::move(v));
  return dict(std::move(keyed));
}

// Pickle protocol 2 with the opcodes PyTorch's weights_only unpickler accepts. Tensors become
// _rebuild_tensor_v2((storage pid), offset 0, size, stride, False, OrderedDict()); their storages are collected.
class Pickler {
 public:
  explicit Pickler(const std::string& what) : what_(what) {}
  std::string out;
  std::vector<Tensor> storages;  // contiguous; storage i is record data/i

  void dump(const PyValue& v) {
    out += "\x80\x02";  // PROTO 2
    value(v);
    out += '.';  // STOP
  }

 private:
  void u32(uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
  void global(const char* module, const char* name) { out += detail::cat('c', module, '\n', name, '\n'); }
  void str(const std::string& s) {
    out += 'X';  // BINUNICODE
    u32(static_cast<uint32_t>(s.size()));
    out += s;
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      out += 'K', out += static_cast<char>(v);  // BININT1
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out += 'J';  // BININT
      const int32_t w = static_cast<int32_t>(v);
      out.append(reinterpret_cast<const char*>(&w), 4);
    } else {
      out += "\x8a\x08";  // LONG1, 8 bytes two's complement little-endian
      out.append(reinterpret_cast<const char*>(&v), 8);
    }
  }
  void ints(const Shape& s) {
    out += '(';  // MARK
    for (int64_t d : s) integer(d);
    out += 't';  // TUPLE
  }
  void value(const PyValue& v) {
    switch (v.kind_) {
      case PyValue::Kind::None: out += 'N'; break;
      case PyValue::Kind::Bool: out += v.bool_ ? '\x88' : '\x89'; break;
      case PyValue::Kind::Int: integer(v.int_); break;
      case PyValue::Kind::String: str(v.string_); break;
      case PyValue::Kind::Tensor: tensor(v.tensor_); break;
      case PyValue::Kind::List:
        out += "](";  // EMPTY_LIST MARK
        for (const PyValue& item : v.items_) value(item);
        out += 'e';  // APPENDS
        break;
      case PyValue::Kind::Tuple:
        out += '(';
        for (const PyValue& item : v.items_) value(item);
        out += 't';
        break;
      case PyValue::Kind::Dict:
        out += "}(";  // EMPTY_DICT MARK
        for (const PyValue& item : v.items_) value(item);
        out += 'u';  // SETITEMS
        break;
    }
  }
  void tensor(const Tensor& t) {
    static const std::map<DType, const char*> kStorage = {{DType::Float32, "FloatStorage"},
                                                          {DType::Float64, "DoubleStorage"},
                                                          {DType::Float16, "HalfStorage"},
                                                          {DType::BFloat16, "BFloat16Storage"},
                                                          {DType::Int64, "LongStorage"}};
    auto it = kStorage.find(t.dtype());
    CASTOR_CHECK(it != kStorage.end(), what_, ": torch.save of a ", dtype_name(t.dtype()), " tensor is not supported");
    const Tensor c = t.detach().contiguous();
    // One storage per distinct tensor data (tied weights share theirs, as in PyTorch).
    const auto id = std::make_tuple(c.data_ptr(), c.nbytes(), c.dtype());
    auto [pos, fresh] = seen_.emplace(id, storages.size());
    if (fresh) storages.push_back(c);
    global("torch._utils", "_rebuild_tensor_v2");
    out += "((";  // MARK (args) MARK (persistent id)
    str("storage");
    global("torch", it->second);
    str(std::to_string(pos->second));
    str("cpu");
    integer(c.numel());
    out += "tQ";  // TUPLE BINPERSID
    integer(0);   // storage offset
    ints(c.shape());
    Shape stride(c.dim());
    for (int64_t d = c.dim() - 1, s = 1; d >= 0; s *= c.size(d), --d) stride[d] = s;
    ints(stride);
    out += '\x89';  // requires_grad False
    global("collections", "OrderedDict");
    out += ")R";  // EMPTY_TUPLE REDUCE: backward hooks
    out += "tR";  // TUPLE REDUCE
  }

  std::string what_;
  std::map<std::tuple<const void*, size_t, DType>, size_t> seen_;
};

namespace {

// A zip archive of stored (uncompressed) records, each record's data 64-byte aligned as PyTorch's writer does.
class ZipWriter {
 public:
  explicit ZipWriter(const std::string& what) : what_(what) {}
  void add(const std::string& name, const void* data, uint64_t size) {
    uLong crc = crc32(0L, Z_NULL, 0);
    for (uint64_t done = 0; done < size;) {  // zlib's crc32 takes a uInt length a call
      const uInt n = static_cast<uInt>(std::min<uint64_t>(size - done, 1u << 30));
      crc = crc32(crc, static_cast<const Bytef*>(data) + done, n);
      done += n;
    }
    const uint32_t c = static_cast<uint32_t>(crc);
    const uint64_t offset = bytes_.size(), header = 30 + name.size() + 4;
    const uint16_t pad = static_cast<uint16_t>((64 - (offset + header) % 64) % 64);
    CASTOR_CHECK(offset + header + pad + size < UINT32_MAX, what_, ": over 4 GiB, more than a zip without zip64 holds");
    u32(0x04034b50), u16(20), u16(0), u16(0), u16(0), u16(0x21);  // signature, version, flags, stored, time, date
    u32(c), u32(static_cast<uint32_t>(size)), u32(static_cast<uint32_t>(size));
    u16(static_cast<uint16_t>(name.size())), u16(static_cast<uint16_t>(4 + pad));
    bytes_.insert(bytes_.end(), name.begin(), name.end());
    u16(0x4246), u16(pad);  // the "FB" padding field PyTorch uses
    bytes_.resize(bytes_.size() + pad, 'Z');
    const auto* p = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + size);
    entries_.push_back({name, c, static_cast<uint32_t>(size), static_cast<uint32_t>(offset)});
  }
  std::vector<uint8_t> finish() {
    const uint64_t start = bytes_.size();
    for (const Entry& e : entries_) {
      u32(0x02014b50), u16(20), u16(20), u16(0), u16(0), u16(0), u16(0x21);
      u32(e.crc), u32(e.size), u32(e.size), u16(static_cast<uint16_t>(e.name.size())), u16(0), u16(0), u16(0), u16(0);
      u32(0), u32(e.offset);
      bytes_.insert(bytes_.end(), e.name.begin(), e.name.end());
    }
    const uint64_t size = bytes_.size() - start;
    CASTOR_CHECK(bytes_.size() + 22 < UINT32_MAX, what_, ": over 4 GiB, more than a zip without zip64 holds");
    u32(0x06054b50), u16(0), u16(0), u16(static_cast<uint16_t>(entries_.size())),
        u16(static_cast<uint16_t>(entries_.size())), u32(static_cast<uint32_t>(size)),
        u32(static_cast<uint32_t>(start)), u16(0);
    return std::move(bytes_);
  }

 private:
  struct Entry {
    std::string name;
    uint32_t crc, size, offset;
  };
  void u16(uint16_t v) { bytes_.insert(bytes_.end(), {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8)}); }
  void u32(uint32_t v) { u16(static_cast<uint16_t>(v)), u16(static_cast<uint16_t>(v >> 16)); }

  std::string what_;
  std::vector<uint8_t> bytes_;
  std::vector<Entry> entries_;
};

}  // namespace

void torch_save(const std::string& path, const PyValue& value) {
  Pickler pickler(path);
  pickler.dump(value);
  const std::string stem = std::filesystem::path(path).stem().string();
  const std::string prefix = (stem.empty() ? std::string("archive") : stem) + "/";
  ZipWriter zip(path);
  zip.add(prefix + "data.pkl", pickler.out.data(), pickler.out.size());
  for (size_t i = 0; i < pickler.storages.size(); ++i) {
    const Tensor& t = pickler.storages[i];
    zip.add(prefix + "data/" + std::to_string(i), t.data_ptr(), t.nbytes());
  }
  zip.add(prefix + "version", "3\n", 2);
  atomic_write_file(path, std::span<const uint8_t>(zip.finish()));
}

}  // namespace castor
