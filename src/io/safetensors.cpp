// Safetensors reader (strict validation of header and layout) and writer.
#include "castor/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <tuple>

#include "castor/check.h"
#include "castor/fs.h"
#include "castor/json.h"

namespace castor {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string quoted(const std::string& s) { return Json(s).dump(); }

std::optional<DType> dtype_from_safetensors_name(const std::string& s) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (s == kDTypeTraits[i].safetensors_name) return static_cast<DType>(i);
  return std::nullopt;
}

// Bytes a tensor of this dtype and shape occupies, or nullopt when a dim is negative or the size overflows.
std::optional<uint64_t> byte_size(DType dtype, const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) return std::nullopt;
  uint64_t bytes;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), dtype_size(dtype), &bytes)) return std::nullopt;
  return bytes;
}

SafetensorsEntry parse_entry(const std::string& name, const Json& v, const std::string& what) {
  std::string where = what + ": tensor " + quoted(name);
  CASTOR_CHECK(v.is_object(), where, ": entry is not an object");
  for (const auto& [key, field] : v.as_object())
    CASTOR_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where, ": unknown field ", quoted(key));
  const Json* dtype = v.find("dtype");
  const Json* shape = v.find("shape");
  const Json* offsets = v.find("data_offsets");
  CASTOR_CHECK(dtype && shape && offsets, where, ": entry needs \"dtype\", \"shape\" and \"data_offsets\"");

  SafetensorsEntry e;
  e.name = name;
  CASTOR_CHECK(dtype->is_string(), where, ": dtype is not a string");
  std::optional<DType> dt = dtype_from_safetensors_name(dtype->as_string());
  CASTOR_CHECK(dt, where, ": unknown dtype ", quoted(dtype->as_string()));
  e.dtype = *dt;

  CASTOR_CHECK(shape->is_array(), where, ": shape is not an array");
  for (const Json& d : shape->as_array()) {
    CASTOR_CHECK(d.is_int() && d.as_int() >= 0, where, ": shape must hold non-negative integers, got ", d.dump());
    e.shape.push_back(d.as_int());
  }
  std::optional<uint64_t> nbytes = byte_size(e.dtype, e.shape);
  CASTOR_CHECK(nbytes, where, ": shape ", shape->dump(), " overflows int64");

  const auto& off = offsets->is_array() ? offsets->as_array() : Json::Array{};
  CASTOR_CHECK(off.size() == 2 && off[0].is_int() && off[1].is_int() && off[0].as_int() >= 0 &&
                   off[0].as_int() <= off[1].as_int(),
               where, ": data_offsets must be [begin, end] with 0 <= begin <= end, got ", offsets->dump());
  e.begin = static_cast<uint64_t>(off[0].as_int());
  e.end = static_cast<uint64_t>(off[1].as_int());
  CASTOR_CHECK(e.end - e.begin == *nbytes, where, ": data_offsets ", offsets->dump(), " span ", e.end - e.begin,
               " bytes, but dtype ", dtype->as_string(), " and shape ", shape->dump(), " need ", *nbytes);
  return e;
}

// Everything but the data buffer, which starts at `data_start` in the file.
struct Layout {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  size_t data_start;
};

// `data` holds the file's first `avail` bytes (all of it, or at least the header) of its `size`.
Layout parse_layout(const uint8_t* data, size_t avail, uint64_t size, const std::string& what) {
  CASTOR_CHECK(size >= 8, what, ": file is ", size, " bytes, too short for the 8-byte header length");
  uint64_t n;
  std::memcpy(&n, data, 8);
  CASTOR_CHECK(n <= kMaxHeaderBytes, what, ": header length ", n, " exceeds the limit of ", kMaxHeaderBytes);
  CASTOR_CHECK(n <= size - 8, what, ": header length ", n, " runs past the end of the file (", size, " bytes)");
  CASTOR_ASSERT(8 + n <= avail, what, ": the header was not read");
  std::string_view text(reinterpret_cast<const char*>(data) + 8, n);
  CASTOR_CHECK(is_valid_utf8(text), what, ": header is not valid UTF-8");
  Json header;
  try {
    header = Json::parse(text);
  } catch (const Error& e) {
    throw Error(detail::cat(what, ": header: ", e.what()));
  }
  CASTOR_CHECK(header.is_object(), what, ": header is not a JSON object");

  Layout layout{{}, {}, static_cast<size_t>(8 + n)};
  for (const auto& [key, v] : header.as_object()) {
    if (key != "__metadata__") {
      layout.entries.push_back(parse_entry(key, v, what));
      continue;
    }
    CASTOR_CHECK(v.is_object(), what, ": __metadata__ is not an object");
    for (const auto& [mk, mv] : v.as_object()) {
      CASTOR_CHECK(mv.is_string(), what, ": __metadata__ value of ", quoted(mk), " is not a string");
      layout.metadata.emplace(mk, mv.as_string());
    }
  }

  auto& entries = layout.entries;
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t pos = 0;
  for (const SafetensorsEntry& e : entries) {
    CASTOR_CHECK(e.begin <= pos, what, ": tensor ", quoted(e.name), " starts at ", e.begin,
                 ", leaving a hole after byte ", pos);
    CASTOR_CHECK(e.begin >= pos, what, ": tensor ", quoted(e.name), " starts at ", e.begin,
                 ", overlapping the tensor that ends at ", pos);
    pos = e.end;
  }
  uint64_t data_size = size - layout.data_start;
  CASTOR_CHECK(pos <= data_size, what, ": data is truncated: tensors need ", pos, " bytes, file holds ", data_size);
  CASTOR_CHECK(pos == data_size, what, ": ", data_size - pos, " bytes left over after the last tensor");
  return layout;
}

SafetensorsFile from_layout(Layout&& layout) {
  SafetensorsFile f;
  f.entries = std::move(layout.entries);
  f.metadata = std::move(layout.metadata);
  return f;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& what) {
  Layout layout = parse_layout(data, size, size, what);
  size_t start = layout.data_start;
  SafetensorsFile f = from_layout(std::move(layout));
  f.bytes.assign(data + start, data + size);
  return f;
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::vector<uint8_t> bytes = read_file(path);
  Layout layout = parse_layout(bytes.data(), bytes.size(), bytes.size(), path);
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(layout.data_start));
  SafetensorsFile f = from_layout(std::move(layout));
  f.bytes = std::move(bytes);
  return f;
}

SafetensorsFile read_safetensors_header(const std::string& path) {
  uint64_t size = 0;
  std::vector<uint8_t> head = read_file_range(path, 0, 8, size);  // the header's length
  uint64_t n;
  std::memcpy(&n, head.data(), 8);
  CASTOR_CHECK(n <= kMaxHeaderBytes, path, ": header length ", n, " exceeds the limit of ", kMaxHeaderBytes);
  CASTOR_CHECK(n <= size - 8, path, ": header length ", n, " runs past the end of the file (", size, " bytes)");
  head = read_file_range(path, 0, 8 + n, size);
  return from_layout(parse_layout(head.data(), head.size(), size, path));
}

namespace {

// The header bytes of a file of `tensors` (length, JSON, padding) and the tensors in data order (by name).
std::vector<uint8_t> header_bytes(const std::vector<SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata, const std::string& what,
                                  std::vector<const SafetensorsTensor*>& sorted, bool lazy = false) {
  for (const SafetensorsTensor& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  Json header(Json::Object{});
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const SafetensorsTensor& t = *sorted[i];
    CASTOR_CHECK(is_valid_utf8(t.name), what, ": tensor name is not valid UTF-8");
    std::string where = what + ": tensor " + quoted(t.name);
    CASTOR_CHECK(t.name != "__metadata__", where, ": the name is reserved");
    CASTOR_CHECK(i == 0 || sorted[i - 1]->name != t.name, where, ": duplicate name");
    std::optional<uint64_t> nbytes = byte_size(t.dtype, t.shape);
    CASTOR_CHECK(nbytes, where, ": shape has a negative dim or overflows int64");
    CASTOR_CHECK(t.nbytes == *nbytes, where, ": has ", t.nbytes, " bytes, but its dtype and shape need ", *nbytes);
    CASTOR_CHECK(lazy || t.data || t.nbytes == 0, where, ": data is null");
    Json::Array shape(t.shape.begin(), t.shape.end());
    header[t.name] = Json(Json::Object{{"dtype", traits(t.dtype).safetensors_name},
                                       {"shape", std::move(shape)},
                                       {"data_offsets", Json::Array{offset, offset + t.nbytes}}});
    offset += t.nbytes;
  }
  if (!metadata.empty()) {
    Json& m = header["__metadata__"];
    for (const auto& [k, v] : metadata) {
      CASTOR_CHECK(is_valid_utf8(k) && is_valid_utf8(v), what, ": metadata is not valid UTF-8");
      m[k] = v;
    }
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::vector<uint8_t> out(8 + text.size());
  uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  return out;
}

}  // namespace

std::vector<uint8_t> serialize_safetensors(const std::vector<SafetensorsTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata,
                                           const std::string& what) {
  std::vector<const SafetensorsTensor*> sorted;
  std::vector<uint8_t> out = header_bytes(tensors, metadata, what, sorted);
  for (const SafetensorsTensor* t : sorted) {
    auto* p = static_cast<const uint8_t*>(t->data);
    out.insert(out.end(), p, p + t->nbytes);
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsTensor*> sorted;
  const std::vector<uint8_t> header = header_bytes(tensors, metadata, path, sorted);
  std::vector<std::span<const uint8_t>> pieces = {header};  // the tensors' bytes where they are
  for (const SafetensorsTensor* t : sorted) pieces.emplace_back(static_cast<const uint8_t*>(t->data), t->nbytes);
  atomic_write_file(path, pieces);
}

void write_safetensors_each(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                            const std::function<std::span<const uint8_t>(size_t)>& bytes,
                            const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsTensor*> sorted;
  const std::vector<uint8_t> header = header_bytes(tensors, metadata, path, sorted, /*lazy=*/true);
  atomic_write_file(path, sorted.size() + 1, [&](size_t i) -> std::span<const uint8_t> {
    if (i == 0) return header;
    const SafetensorsTensor& t = *sorted[i - 1];
    const std::span<const uint8_t> b = bytes(static_cast<size_t>(&t - tensors.data()));
    CASTOR_CHECK(b.size() == t.nbytes, path, ": tensor ", quoted(t.name), " was made of ", b.size(),
                 " bytes, its dtype and shape need ", t.nbytes);
    return b;
  });
}

}  // namespace castor
