#include "io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <utility>

namespace sp::io {
namespace {

using json = nlohmann::json;

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

// Short rendering of a JSON value for messages (truncated so messages stay readable).
std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  return s.size() > 64 ? s.substr(0, 61) + "..." : s;
}

// numel * dtype_size; nullopt on a negative dimension or overflow.
std::optional<uint64_t> checked_nbytes(const std::vector<int64_t>& shape, DType dt) {
  int64_t n = 1;
  uint64_t bytes = 0;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  if (__builtin_mul_overflow(static_cast<uint64_t>(n), dtype_size(dt), &bytes)) return std::nullopt;
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

[[noreturn]] void not_safetensors(const std::string& source, const std::string& why) {
  throw SafetensorsError(quote(source) + " is not a safetensors file: " + why);
}

std::string too_short(size_t size) {
  if (size == 0) return "it is empty";
  return "it has " + std::to_string(size) + (size == 1 ? " byte" : " bytes") +
         ", fewer than the 8-byte header length every safetensors file begins with";
}

std::string byte_str(std::byte b) {
  const auto c = std::to_integer<unsigned char>(b);
  char buf[16];
  std::snprintf(buf, sizeof buf, c >= 0x20 && c < 0x7f ? "'%c'" : "byte 0x%02x", c);
  return buf;
}

// What a file with an impossible header length is more likely to be, from its first bytes;
// empty when nothing is recognized.
std::string likely_kind(const std::byte* p, size_t size) {
  auto starts = [&](std::string_view magic) {
    return size >= magic.size() && std::memcmp(p, magic.data(), magic.size()) == 0;
  };
  size_t i = starts("\xef\xbb\xbf") ? 3 : 0;  // a UTF-8 byte order mark
  auto space = [](std::byte b) {
    return b == std::byte{' '} || b == std::byte{'\t'} || b == std::byte{'\r'} || b == std::byte{'\n'};
  };
  while (i < size && i < 4096 && space(p[i])) ++i;
  if (i < size && (p[i] == std::byte{'{'} || p[i] == std::byte{'['}))
    return "it looks like a JSON document (it begins with " + byte_str(p[i]) +
           "), while a safetensors file begins with an 8-byte little-endian header length "
           "followed by its JSON header";
  if (starts("PK\x03\x04"))
    return "it looks like a zip archive (PyTorch .pt/.pth/.bin checkpoints are zip archives; "
           "convert it to safetensors first)";
  if (starts("GGUF")) return "it looks like a GGUF file";
  return {};
}

// A byte count in the largest binary unit not above it, shown beside the exact count.
std::string human(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024;
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

constexpr size_t kWriteBuffer = size_t{1} << 20;

// Throws unless `name` can name a tensor: not the metadata key, and valid UTF-8.
void check_name(const std::string& where, const std::string& name) {
  if (name == kMetadataKey) throw SafetensorsError(where + "name is reserved");
  if (auto bad = utf8_error(name))
    throw SafetensorsError(where + "name is not valid UTF-8 (bad byte at " + std::to_string(*bad) + ")");
}

// "shape [2, 3] x BF16 (2 bytes) = 12 bytes but <rest>": a tensor's size against another.
std::string size_mismatch(const std::vector<int64_t>& shape, DType dt, uint64_t bytes, const std::string& rest) {
  return "shape " + shape_string(shape) + " x " + std::string(dtype_name(dt)) + " (" + std::to_string(dtype_size(dt)) +
         " bytes) = " + std::to_string(bytes) + " bytes but " + rest;
}

// checked_nbytes, or throws `where` + the shape where a dimension is negative or the count overflows.
uint64_t declared_nbytes(const std::string& where, const std::vector<int64_t>& shape, DType dt) {
  auto bytes = checked_nbytes(shape, dt);
  if (!bytes)
    throw SafetensorsError(where + "shape " + shape_string(shape) + " has a negative dimension or overflows");
  return *bytes;
}

// Throws unless a metadata key and value are valid UTF-8; `writer` names the writer in the message.
void check_metadata(const std::string& writer, const std::string& key, const std::string& value) {
  for (const auto* s : {&key, &value})
    if (utf8_error(*s))
      throw SafetensorsError(writer + ": metadata " + quote(key) + " is not valid UTF-8");
}

}  // namespace

// ---------------------------------------------------------------------------- dtypes

size_t dtype_size(DType d) { return row(d).size; }
std::string_view dtype_name(DType d) { return row(d).name; }
std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& r : kDTypes)
    if (r.name == name) return r.dtype;
  return std::nullopt;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t TensorInfo::numel() const { return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>()); }
uint64_t TensorInfo::nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype); }

// ---------------------------------------------------------------------------- reader

void SafetensorsFile::Unmap::operator()(void* addr) const { ::munmap(addr, len); }

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.source_ = path;
  size_t size = 0;
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw SafetensorsError(path + ": cannot open: " + errno_str());
    const struct Closer {  // the mapping stays valid after close
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st{};
    if (::fstat(fd, &st) != 0) throw SafetensorsError(path + ": cannot stat: " + errno_str());
    if (!S_ISREG(st.st_mode)) throw SafetensorsError(path + ": not a regular file");
    size = static_cast<size_t>(st.st_size);
    if (size < 8) not_safetensors(path, too_short(size));
    void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) throw SafetensorsError(path + ": mmap failed: " + errno_str());
    f.map_ = std::unique_ptr<void, Unmap>(addr, Unmap{size});
  }
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
  if (file_size < 8) not_safetensors(src, too_short(file_size));

  // A header begins with '{' (the format requires it). Without that brace an impossible
  // length means the file is something else altogether; with it, the file is a safetensors
  // file with a bad header (truncated, or written by a broken tool), reported specifically.
  const uint64_t hlen = read_le64(base());
  const bool brace = file_size > 8 && base()[8] == std::byte{'{'};
  if (!brace && (hlen > kMaxHeaderBytes || hlen > file_size - 8)) {
    std::string why = likely_kind(base(), file_size);
    if (why.empty())
      why = "its first 8 bytes, read as the little-endian header length, give " + std::to_string(hlen) +
            " bytes, but " +
            (hlen > file_size - 8 ? "the file has " + std::to_string(file_size) + " bytes"
                                  : "headers are limited to " + std::to_string(kMaxHeaderBytes) + " bytes");
    not_safetensors(src, why);
  }
  if (hlen > kMaxHeaderBytes)
    fail("header length " + std::to_string(hlen) + " exceeds the limit of " +
         std::to_string(kMaxHeaderBytes) + " bytes");
  if (hlen > file_size - 8)
    fail("header length " + std::to_string(hlen) + " exceeds the " +
         std::to_string(file_size - 8) + " bytes after the length prefix (file is " +
         std::to_string(file_size) + " bytes; truncated?)");
  if (hlen == 0) not_safetensors(src, "its header length is 0, too short for a JSON header (at least '{}')");
  if (!brace)
    not_safetensors(src, "the header does not begin with '{' (it begins with " + byte_str(base()[8]) + ")");
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
      tfail("shape " + shape_string(t.shape) + " x " + std::string(dtype_name(t.dtype)) +
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
      tfail(size_mismatch(t.shape, t.dtype, *want, "data_offsets span " + std::to_string(t.end - t.begin) + " bytes"));
    if (t.end > data_size)
      tfail(range + " extends past the data section of " + std::to_string(data_size) + " bytes");
    const TensorInfo& added = tensors_.emplace(name, std::move(t)).first->second;  // names are unique (parsed so)
    if (added.end > added.begin) by_begin.push_back(&added);
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
  check_name(where, name);
  for (const auto& e : entries_)
    if (e.info.name == name) throw SafetensorsError(where + "duplicate tensor name");
  const uint64_t want = declared_nbytes(where, shape, dtype);
  if (want != data.size())
    throw SafetensorsError(where +
                           size_mismatch(shape, dtype, want, std::to_string(data.size()) + " bytes were given"));
  entries_.push_back(
      {TensorInfo{std::move(name), dtype, std::move(shape)}, std::vector<std::byte>(data.begin(), data.end())});
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  check_metadata("SafetensorsWriter", key, value);
  metadata_[std::move(key)] = std::move(value);
}

void SafetensorsWriter::declare_all(SafetensorsStreamWriter& s) const {
  for (const auto& [k, v] : metadata_) s.set_metadata(k, v);
  for (const auto& e : entries_) s.declare(e.info.name, e.info.dtype, e.info.shape);
}

std::vector<std::byte> SafetensorsWriter::serialize() const {
  SafetensorsStreamWriter s;
  declare_all(s);
  const std::string h = s.header();
  std::vector<std::byte> out(reinterpret_cast<const std::byte*>(h.data()),
                             reinterpret_cast<const std::byte*>(h.data() + h.size()));
  for (const auto& e : entries_) out.insert(out.end(), e.data.begin(), e.data.end());
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  SafetensorsStreamWriter s;
  declare_all(s);
  s.open(path);
  for (const auto& e : entries_) s.write(e.data);
  s.commit();
}

// ---------------------------------------------------------------------------- stream writer

std::optional<uint64_t> free_bytes_for(const std::string& path) {
  uint64_t n = 0;
  if (const char* v = std::getenv("STREAMPLAN_FREE_BYTES_FOR_TESTS")) {
    char* end = nullptr;
    errno = 0;
    n = std::strtoull(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno != 0 || *v == '-')
      throw SafetensorsError("STREAMPLAN_FREE_BYTES_FOR_TESTS=" + quote(v) + " is not a byte count");
  } else {
    std::string dir = std::filesystem::path(path).parent_path().string();
    if (dir.empty()) dir = ".";
    struct statvfs vfs{};
    if (::statvfs(dir.c_str(), &vfs) != 0) return std::nullopt;
    n = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  }
  struct stat st{};
  if (::stat((path + ".tmp").c_str(), &st) == 0 && S_ISREG(st.st_mode)) n += static_cast<uint64_t>(st.st_blocks) * 512;
  return n;
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void SafetensorsStreamWriter::declare(std::string name, DType dtype, std::vector<int64_t> shape) {
  const std::string where = "safetensors writer: tensor " + quote(name) + ": ";
  if (!path_.empty()) throw SafetensorsError(where + "declared after open()");
  check_name(where, name);
  const uint64_t bytes = declared_nbytes(where, shape, dtype);
  if (names_.count(name)) throw SafetensorsError(where + "duplicate tensor name");

  // The entry exactly as nlohmann's compact dump writes it (key escaping included), so the
  // header never has to exist as a JSON tree.
  const uint64_t begin = data_bytes_;
  const nlohmann::ordered_json entry = {
      {"dtype", std::string(dtype_name(dtype))}, {"shape", shape}, {"data_offsets", {begin, begin + bytes}}};
  entries_json_ += "," + json(name).dump() + ":" + entry.dump();
  data_bytes_ += bytes;
  tensors_.push_back(TensorInfo{std::move(name), dtype, std::move(shape), begin, begin + bytes});
  names_.insert(tensors_.back().name);
  if (header_bytes() - 8 > kMaxHeaderBytes)
    throw SafetensorsError(where + "the header reaches " + std::to_string(header_bytes() - 8) +
                           " bytes at this tensor (number " + std::to_string(tensors_.size()) +
                           "), beyond the limit of " + std::to_string(kMaxHeaderBytes) +
                           " bytes that readers accept");
}

void SafetensorsStreamWriter::set_metadata(std::string key, std::string value) {
  check_metadata("safetensors writer", key, value);
  if (!path_.empty()) throw SafetensorsError("safetensors writer: metadata " + quote(key) + " set after open()");
  metadata_[std::move(key)] = std::move(value);
  metadata_json_ = json(metadata_).dump();
}

uint64_t SafetensorsStreamWriter::header_bytes() const {
  // '{' + ["__metadata__":meta] + entries (their leading comma dropped without metadata) + '}'
  uint64_t n = 2 + entries_json_.size();
  if (!metadata_.empty()) n += std::string_view("\"__metadata__\":").size() + metadata_json_.size();
  else if (!entries_json_.empty()) n -= 1;
  return 8 + (n + 7) / 8 * 8;
}

std::string SafetensorsStreamWriter::header() const {
  std::string text = "{";
  if (!metadata_.empty())
    text += "\"__metadata__\":" + metadata_json_ + entries_json_;
  else if (!entries_json_.empty())
    text.append(entries_json_, 1);
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return out + text;
}

void SafetensorsStreamWriter::open(const std::string& path) {
  if (!path_.empty()) throw SafetensorsError(path + ": safetensors writer already opened for " + path_);
  const uint64_t hbytes = header_bytes();
  if (hbytes - 8 > kMaxHeaderBytes)
    throw SafetensorsError(path + ": the header of " + std::to_string(tensors_.size()) + " tensors would be " +
                           std::to_string(hbytes - 8) + " bytes, beyond the limit of " +
                           std::to_string(kMaxHeaderBytes) + " bytes that readers accept; nothing was written");
  const std::string tmp = path + ".tmp";
  if (const auto avail = free_bytes_for(path); avail && file_bytes() > *avail)
    throw SafetensorsError(path + ": the file needs " + std::to_string(file_bytes()) + " bytes (" +
                           human(file_bytes()) + ") but its filesystem has " + std::to_string(*avail) + " bytes (" +
                           human(*avail) + ") free; nothing was written");
  fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw SafetensorsError(path + ": cannot create " + tmp + ": " + errno_str());
  path_ = path;
  tmp_ = tmp;
  buffer_.reserve(kWriteBuffer);
  const std::string h = header();
  put(h.data(), h.size());
}

void SafetensorsStreamWriter::write(std::span<const std::byte> data) {
  if (fd_ < 0) throw SafetensorsError("safetensors writer: write() without open() or after commit()");
  if (next_ >= tensors_.size())
    fail("all " + std::to_string(tensors_.size()) + " declared tensors are already written");
  const TensorInfo& t = tensors_[next_];
  if (data.size() != t.nbytes())
    fail("tensor " + quote(t.name) + ": " +
         size_mismatch(t.shape, t.dtype, t.nbytes(), std::to_string(data.size()) + " bytes were given"));
  put(data.data(), data.size());
  ++next_;
}

void SafetensorsStreamWriter::commit() {
  if (fd_ < 0) throw SafetensorsError("safetensors writer: commit() without open() or twice");
  if (next_ != tensors_.size())
    fail("commit() after " + std::to_string(next_) + " of " + std::to_string(tensors_.size()) +
         " tensors; the next one is " + quote(tensors_[next_].name));
  flush();
  if (::fsync(fd_) != 0) fail("fsync of " + tmp_ + " failed: " + errno_str());
  if (::close(std::exchange(fd_, -1)) != 0) fail("close of " + tmp_ + " failed: " + errno_str());
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("rename " + tmp_ + " -> " + path_ + " failed: " + errno_str());
}

void SafetensorsStreamWriter::put(const void* p, size_t n) {
  bytes_written_ += n;
  const char* c = static_cast<const char*>(p);
  if (buffer_.size() + n <= kWriteBuffer) {
    buffer_.insert(buffer_.end(), c, c + n);
    return;
  }
  flush();
  write_all(c, n);
}

void SafetensorsStreamWriter::flush() {
  write_all(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void SafetensorsStreamWriter::write_all(const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write to " + tmp_ + " failed: " + (w < 0 ? errno_str() : "no progress"));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Called only once open() succeeded; after commit() closed the file, it still removes it.
void SafetensorsStreamWriter::fail(const std::string& what) {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  ::unlink(tmp_.c_str());
  throw SafetensorsError(path_ + ": " + what);
}

}  // namespace sp::io
