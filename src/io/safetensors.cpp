#include "io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

namespace sp::io {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // same bound as the reference implementation
constexpr int kMaxJsonDepth = 16;                  // a valid header nests 3 deep
const char* const kMetadataKey = "__metadata__";

struct DTypeRow {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeRow, 12> kDTypes{{
    {DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::I64, "I64", 8}, {DType::I32, "I32", 4}, {DType::I16, "I16", 2},
    {DType::I8, "I8", 1}, {DType::U8, "U8", 1}, {DType::BOOL, "BOOL", 1},
}};

const DTypeRow& row(DType d) {
  for (const auto& r : kDTypes)
    if (r.dtype == d) return r;
  throw SafetensorsError("invalid DType value " + std::to_string(static_cast<int>(d)));
}

// Quotes a name for an error message, escaping control characters.
std::string quote(std::string_view s) {
  std::string out = "'";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "'";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Short rendering of a JSON value for messages (truncated so messages stay readable).
std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  return s.size() > 64 ? s.substr(0, 61) + "..." : s;
}

// numel with overflow detection; nullopt on overflow.
std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

std::optional<uint64_t> checked_nbytes(const std::vector<int64_t>& shape, DType dt) {
  auto n = checked_numel(shape);
  uint64_t bytes = 0;
  if (!n || __builtin_mul_overflow(static_cast<uint64_t>(*n), dtype_size(dt), &bytes))
    return std::nullopt;
  return bytes;
}

// Returns the offset of the first invalid UTF-8 byte, or nullopt if `s` is valid UTF-8
// (no overlongs, no surrogates, nothing above U+10FFFF).
std::optional<size_t> utf8_error(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > n) return i;
    uint32_t cp = len == 1 ? c : c & (0x7fu >> len);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return std::nullopt;
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<uint64_t>(p[i]);
  return v;
}

std::string errno_str() { return std::strerror(errno); }

}  // namespace

// ---------------------------------------------------------------------------- dtypes

size_t dtype_size(DType d) { return row(d).size; }
std::string_view dtype_name(DType d) { return row(d).name; }
std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& r : kDTypes)
    if (r.name == name) return r.dtype;
  return std::nullopt;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
uint64_t TensorInfo::nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype); }

// ---------------------------------------------------------------------------- reader

SafetensorsFile::Mapping& SafetensorsFile::Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (addr_) ::munmap(addr_, len_);
    addr_ = std::exchange(o.addr_, nullptr);
    len_ = std::exchange(o.len_, 0);
  }
  return *this;
}

SafetensorsFile::Mapping::~Mapping() {
  if (addr_) ::munmap(addr_, len_);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.source_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SafetensorsError(path + ": cannot open: " + errno_str());
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    std::string e = errno_str();
    ::close(fd);
    throw SafetensorsError(path + ": cannot stat: " + e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw SafetensorsError(path + ": not a regular file");
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw SafetensorsError(path + ": file is " + std::to_string(size) +
                           " bytes, shorter than the 8-byte header length prefix");
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string e = errno_str();
  ::close(fd);  // the mapping stays valid after close
  if (addr == MAP_FAILED) throw SafetensorsError(path + ": mmap failed: " + e);
  f.map_ = Mapping(addr, size);
  f.parse(size);
  return f;
}

SafetensorsFile SafetensorsFile::from_memory(std::vector<std::byte> data) {
  SafetensorsFile f;
  f.source_ = "<memory>";
  f.owned_ = std::move(data);
  f.parse(f.owned_.size());
  return f;
}

void SafetensorsFile::parse(size_t file_size) {
  const std::string& src = source_;
  auto fail = [&](const std::string& msg) { throw SafetensorsError(src + ": " + msg); };
  if (file_size < 8)
    fail("file is " + std::to_string(file_size) +
         " bytes, shorter than the 8-byte header length prefix");

  const uint64_t hlen = read_le64(base());
  if (hlen > kMaxHeaderBytes)
    fail("header length " + std::to_string(hlen) + " exceeds the limit of " +
         std::to_string(kMaxHeaderBytes) + " bytes");
  if (hlen > file_size - 8)
    fail("header length " + std::to_string(hlen) + " exceeds the " +
         std::to_string(file_size - 8) + " bytes after the length prefix (file is " +
         std::to_string(file_size) + " bytes)");
  data_offset_ = 8 + hlen;
  const uint64_t data_size = file_size - data_offset_;
  const std::string_view text(reinterpret_cast<const char*>(base() + 8), hlen);

  if (auto bad = utf8_error(text))
    fail("header is not valid UTF-8 (bad byte at header offset " + std::to_string(*bad) + ")");

  // Parse, rejecting duplicate keys (which nlohmann would silently overwrite) and deep nesting.
  std::vector<std::set<std::string>> open_objects;
  auto guard = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth > kMaxJsonDepth)
      fail("header JSON is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (ev == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (ev == json::parse_event_t::key) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(k).second)
        fail("header JSON has duplicate key " + quote(k) +
             (open_objects.size() > 1 ? " inside an entry" : ""));
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), guard);
  } catch (const json::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header must be a JSON object, got " + std::string(header.type_name()));

  std::vector<const TensorInfo*> by_begin;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object())
        fail("__metadata__ must be an object of strings, got " + brief(entry));
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          fail("__metadata__ key " + quote(k) + " must map to a string, got " + brief(v));
        metadata_.emplace(k, v.get<std::string>());
      }
      continue;
    }
    const std::string where = "tensor " + quote(name) + ": ";
    auto tfail = [&](const std::string& msg) { fail(where + msg); };
    if (!entry.is_object()) tfail("entry must be an object, got " + brief(entry));
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(key)) tfail(std::string("missing key '") + key + "'");
    for (const auto& [k, v] : entry.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        tfail("unexpected key " + quote(k));

    TensorInfo t;
    t.name = name;
    const json& dt = entry["dtype"];
    auto parsed_dt = dt.is_string() ? dtype_from_name(dt.get_ref<const std::string&>()) : std::nullopt;
    if (!parsed_dt)
      tfail("unknown dtype " + brief(dt) +
            " (expected one of F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U8 BOOL)");
    t.dtype = *parsed_dt;

    const json& shape = entry["shape"];
    if (!shape.is_array()) tfail("shape must be an array of non-negative integers, got " + brief(shape));
    for (size_t i = 0; i < shape.size(); ++i) {
      const json& d = shape[i];
      if (!d.is_number_unsigned() ||
          d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        tfail("shape " + brief(shape) + ": dimension " + std::to_string(i) + " is " + brief(d) +
              ", not a non-negative 64-bit integer");
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    auto want = checked_nbytes(t.shape, t.dtype);
    if (!want)
      tfail("shape " + shape_str(t.shape) + " x " + std::string(dtype_name(t.dtype)) +
            " overflows 64-bit element/byte count");

    const json& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      tfail("data_offsets must be [begin, end] with non-negative integers, got " + brief(off));
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    const std::string range = "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
    if (t.begin > t.end) tfail(range + " has begin > end");
    if (*want != t.end - t.begin)
      tfail("shape " + shape_str(t.shape) + " x " + std::string(dtype_name(t.dtype)) + " (" +
            std::to_string(dtype_size(t.dtype)) + " bytes) = " + std::to_string(*want) +
            " bytes but data_offsets span " + std::to_string(t.end - t.begin) + " bytes");
    if (t.end > data_size)
      tfail(range + " extends past the data section of " + std::to_string(data_size) + " bytes");
    auto [it, inserted] = tensors_.emplace(name, std::move(t));
    (void)inserted;  // duplicates were rejected while parsing
    if (it->second.end > it->second.begin) by_begin.push_back(&it->second);
  }

  // Overlap check over non-empty ranges, sorted by begin (gaps are allowed).
  std::sort(by_begin.begin(), by_begin.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
  });
  const TensorInfo* reach = nullptr;  // the range extending furthest so far
  for (const TensorInfo* t : by_begin) {
    if (reach && t->begin < reach->end)
      fail("tensor " + quote(t->name) + " data_offsets [" + std::to_string(t->begin) + ", " +
           std::to_string(t->end) + "] overlaps tensor " + quote(reach->name) + " data_offsets [" +
           std::to_string(reach->begin) + ", " + std::to_string(reach->end) + "]");
    if (!reach || t->end > reach->end) reach = t;
  }
}

bool SafetensorsFile::contains(const std::string& name) const { return tensors_.count(name) != 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw SafetensorsError(source_ + ": no tensor named " + quote(name));
  return it->second;
}

std::span<const std::byte> SafetensorsFile::bytes(const std::string& name) const {
  const TensorInfo& t = info(name);
  return {base() + data_offset_ + t.begin, static_cast<size_t>(t.end - t.begin)};
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;  // std::map keeps them sorted
}

// ---------------------------------------------------------------------------- writer

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape,
                            std::span<const std::byte> data) {
  const std::string where = "SafetensorsWriter: tensor " + quote(name) + ": ";
  if (name == kMetadataKey) throw SafetensorsError(where + "name is reserved");
  if (auto bad = utf8_error(name))
    throw SafetensorsError(where + "name is not valid UTF-8 (bad byte at " + std::to_string(*bad) + ")");
  for (const auto& e : entries_)
    if (e.info.name == name) throw SafetensorsError(where + "duplicate tensor name");
  auto want = checked_nbytes(shape, dtype);
  if (!want)
    throw SafetensorsError(where + "shape " + shape_str(shape) +
                           " has a negative dimension or overflows");
  if (*want != data.size())
    throw SafetensorsError(where + "shape " + shape_str(shape) + " x " +
                           std::string(dtype_name(dtype)) + " (" + std::to_string(dtype_size(dtype)) +
                           " bytes) = " + std::to_string(*want) + " bytes but " +
                           std::to_string(data.size()) + " bytes were given");
  const uint64_t begin = entries_.empty() ? 0 : entries_.back().info.end;
  Entry e{TensorInfo{std::move(name), dtype, std::move(shape), begin, begin + data.size()},
          std::vector<std::byte>(data.begin(), data.end())};
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  for (const auto* s : {&key, &value})
    if (utf8_error(*s))
      throw SafetensorsError("SafetensorsWriter: metadata " + quote(key) + " is not valid UTF-8");
  metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::header() const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) h[kMetadataKey] = metadata_;
  for (const auto& e : entries_)
    h[e.info.name] = {{"dtype", dtype_name(e.info.dtype)},
                      {"shape", e.info.shape},
                      {"data_offsets", {e.info.begin, e.info.end}}};
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return out + text;
}

std::vector<std::byte> SafetensorsWriter::serialize() const {
  const std::string h = header();
  std::vector<std::byte> out(reinterpret_cast<const std::byte*>(h.data()),
                             reinterpret_cast<const std::byte*>(h.data() + h.size()));
  for (const auto& e : entries_) out.insert(out.end(), e.data.begin(), e.data.end());
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw SafetensorsError(path + ": cannot create " + tmp + ": " + errno_str());
  auto bail = [&](const std::string& what) {
    std::string e = errno_str();
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw SafetensorsError(path + ": " + what + ": " + e);
  };
  auto put = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) bail("write to " + tmp + " failed");
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  const std::string h = header();
  put(h.data(), h.size());
  for (const auto& e : entries_) put(e.data.data(), e.data.size());
  if (::fsync(fd) != 0) bail("fsync of " + tmp + " failed");
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0) bail("close of " + tmp + " failed");
  if (::rename(tmp.c_str(), path.c_str()) != 0) bail("rename " + tmp + " -> " + path + " failed");
}

}  // namespace sp::io
