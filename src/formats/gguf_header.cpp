// GGUF's header (castor/gguf.h's read_gguf_header): every field checked against the file, read front to back without
// trusting a count or a length (the fuzz target fuzz/gguf_fuzz.cpp runs it).
#include <algorithm>
#include <cstring>
#include <set>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/gguf.h"
#include "castor/quant.h"

namespace castor::formats {

namespace {

// GGUF's value types (gguf.md, gguf_type).
enum : uint32_t { kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64, kValueTypes };
constexpr uint64_t kValueSize[kValueTypes] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 12, 8, 8, 8};  // (string, array: least)

// ggml's tensor type `id` as a row of the block-type table (castor/quant.h: GGUF's ids), or null (NF4 is no GGUF type).
const quant::BlockTypeInfo* ggml_type(uint32_t id) {
  for (const quant::BlockTypeInfo& t : quant::block_types())
    if (static_cast<uint32_t>(t.id) == id && t.id != quant::BlockType::NF4) return &t;
  return nullptr;
}

// The file read front to back through a buffer, each read checked against its size ("truncated" naming the field).
class Cursor {
 public:
  explicit Cursor(const std::string& path) : path_(path) { read_file_range(path, 0, 0, size_); }
  uint64_t size() const { return size_; }
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  const uint8_t* take(uint64_t n, const std::string& field) {
    CASTOR_CHECK(n <= left(), path_, ": truncated at ", field, " (", n, " bytes needed at offset ", pos_,
                 ", the file has ", size_, ")");
    if (pos_ < start_ || pos_ + n > start_ + buf_.size()) {
      start_ = pos_;
      buf_ = read_file_range(path_, pos_, std::min<uint64_t>(left(), std::max<uint64_t>(n, 1 << 20)), size_);
    }
    const uint8_t* p = buf_.data() + (pos_ - start_);
    pos_ += n;
    return p;
  }
  template <class T>
  T get(const std::string& field) {
    T v;
    std::memcpy(&v, take(sizeof v, field), sizeof v);
    return v;
  }
  std::string string(const std::string& field) {
    const uint64_t n = get<uint64_t>(field + "'s length");
    CASTOR_CHECK(n <= left(), path_, ": ", field, ": a string of ", n, " bytes, past the end of the file");
    const uint8_t* p = take(n, field);
    return std::string(reinterpret_cast<const char*>(p), n);
  }

 private:
  std::string path_;
  uint64_t size_ = 0, pos_ = 0, start_ = 0;
  std::vector<uint8_t> buf_;
};

Json scalar(Cursor& c, uint32_t type, const std::string& field) {
  switch (type) {
    case kU8: return Json(static_cast<int64_t>(c.get<uint8_t>(field)));
    case kI8: return Json(static_cast<int64_t>(c.get<int8_t>(field)));
    case kU16: return Json(static_cast<int64_t>(c.get<uint16_t>(field)));
    case kI16: return Json(static_cast<int64_t>(c.get<int16_t>(field)));
    case kU32: return Json(static_cast<int64_t>(c.get<uint32_t>(field)));
    case kI32: return Json(static_cast<int64_t>(c.get<int32_t>(field)));
    case kF32: return Json(static_cast<double>(c.get<float>(field)));
    case kBool: return Json(c.get<uint8_t>(field) != 0);
    case kString: return Json(c.string(field));
    case kU64: return Json(static_cast<int64_t>(c.get<uint64_t>(field)));
    case kI64: return Json(c.get<int64_t>(field));
    case kF64: return Json(c.get<double>(field));
  }
  return Json();
}

Json value(Cursor& c, uint32_t type, const std::string& path, const std::string& field) {
  CASTOR_CHECK(type < kValueTypes, path, ": ", field, ": unknown value type ", type);
  if (type != kArray) return scalar(c, type, field);
  const uint32_t elem = c.get<uint32_t>(field + "'s element type");
  CASTOR_CHECK(elem < kValueTypes && elem != kArray, path, ": ", field, ": unknown array element type ", elem);
  const uint64_t n = c.get<uint64_t>(field + "'s length");
  CASTOR_CHECK(n <= c.left() / kValueSize[elem], path, ": ", field, ": an array of ", n,
               " elements, more than the rest of the file holds");
  Json::Array out;
  out.reserve(n);
  for (uint64_t i = 0; i < n; ++i) out.push_back(scalar(c, elem, field));
  return Json(std::move(out));
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  const quant::BlockTypeInfo* t = ggml_type(type);
  if (!t) return "";
  std::string name = t->name;  // (ggml spells the K-quants' K upper case: q4_K)
  if (name.back() == 'k') name.back() = 'K';
  return name;
}

GgufHeader read_gguf_header(const std::string& path) {
  Cursor c(path);
  GgufHeader h;
  CASTOR_CHECK(c.get<uint32_t>("the magic number") == kGgufMagic, path, ": not a GGUF file (no \"GGUF\" at its start)");
  h.version = c.get<uint32_t>("the version");
  CASTOR_CHECK(h.version == 2 || h.version == 3, path, ": GGUF version ", h.version, " (2 and 3 are read)");
  const uint64_t n_tensors = c.get<uint64_t>("the tensor count"), n_kv = c.get<uint64_t>("the key-value count");
  // (each key-value pair takes at least 12 bytes, each tensor info 24: counts beyond the file are lies)
  CASTOR_CHECK(n_kv <= c.left() / 12 && n_tensors <= c.left() / 24, path, ": the header claims ", n_tensors,
               " tensors and ", n_kv, " key-value pairs, more than the file holds");
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.string(detail::cat("key ", i));
    const uint32_t type = c.get<uint32_t>(key + "'s type");
    Json v = value(c, type, path, key);
    CASTOR_CHECK(h.kv.emplace(key, std::move(v)).second, path, ": key ", printable(key), " appears twice");
  }
  uint64_t alignment = 32;
  if (const Json* a = h.find("general.alignment")) {
    CASTOR_CHECK(a->is_int() && a->as_int() > 0 && (a->as_int() & (a->as_int() - 1)) == 0, path, ": general.alignment ",
                 a->dump(), " is not a power of two");
    alignment = static_cast<uint64_t>(a->as_int());
  }
  std::set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = c.string(detail::cat("tensor ", i, "'s name"));
    const std::string field = "tensor " + printable(t.name);
    CASTOR_CHECK(names.insert(t.name).second, path, ": ", field, " appears twice");
    const uint32_t dims = c.get<uint32_t>(field + "'s dims");
    CASTOR_CHECK(dims >= 1 && dims <= 4, path, ": ", field, " has ", dims, " dims (1 to 4)");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const uint64_t n = c.get<uint64_t>(field + "'s dims");
      CASTOR_CHECK(n > 0 && n <= (uint64_t(1) << 62) / numel, path, ": ", field, "'s dims overflow (", n, " at dim ", d,
                   ")");
      numel *= n;
      t.ne.push_back(n);
    }
    t.type = c.get<uint32_t>(field + "'s type");
    const quant::BlockTypeInfo* g = ggml_type(t.type);
    CASTOR_CHECK(g, path, ": ", field, ": unknown tensor type ", t.type);
    const auto block = static_cast<uint64_t>(g->block);
    CASTOR_CHECK(t.ne[0] % block == 0, path, ": ", field, ": rows of ", t.ne[0], " values are not whole ",
                 ggml_type_name(t.type), " blocks of ", block);
    CASTOR_CHECK(numel / block <= UINT64_MAX / static_cast<uint64_t>(g->bytes), path, ": ", field, "'s dims overflow (",
                 numel, " values)");
    t.bytes = numel / block * static_cast<uint64_t>(g->bytes);
    t.begin = c.get<uint64_t>(field + "'s offset");
    CASTOR_CHECK(t.begin % alignment == 0, path, ": ", field, ": offset ", t.begin,
                 " is not a multiple of the alignment ", alignment);
    h.tensors.push_back(std::move(t));
  }
  const uint64_t data = (c.pos() + alignment - 1) / alignment * alignment;
  for (GgufTensorInfo& t : h.tensors) {
    CASTOR_CHECK(t.begin <= c.size() && data <= c.size() - t.begin && t.bytes <= c.size() - data - t.begin, path,
                 ": tensor ", printable(t.name), ": its data (", t.bytes, " bytes at ", t.begin,
                 " in the data section) lies past the end of the file");
    t.begin += data;
  }
  return h;
}

}  // namespace castor::formats
