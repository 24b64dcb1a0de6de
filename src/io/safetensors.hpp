// Memory-mapped, lazy, fully validating safetensors reader and two writers (README.md says
// what is validated and how errors read).
//
// Reading:
//   auto f = sp::io::SafetensorsFile::open("model.safetensors");  // mmap + header validation
//   for (const auto& name : f.names()) {
//     const sp::io::TensorInfo& t = f.info(name);                 // dtype, shape, offsets
//     std::span<const std::byte> raw = f.bytes(name);             // view into the mapping
//   }
//
// Writing tensors held in memory (atomic: goes to path + ".tmp", then rename):
//   sp::io::SafetensorsWriter w;
//   w.add("fc.weight", sp::io::DType::BF16, {4, 8}, std::as_bytes(std::span(buf)));
//   w.write("out.safetensors");
//
// Streaming a file larger than memory: declare every tensor first (that fixes the header and
// the file size), then hand over the bytes one tensor at a time, in declaration order:
//   sp::io::SafetensorsStreamWriter s;
//   s.declare("fc.weight", sp::io::DType::BF16, {4, 8});
//   s.open("out.safetensors");           // refuses a file larger than the free disk space
//   s.write(std::as_bytes(std::span(buf)));
//   s.commit();                          // fsync + rename; without it the temp file is removed
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace sp::io {

// The largest header (JSON text with its padding) readers accept: the reference
// implementation's bound. Writers refuse to produce a larger one.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);                     // "BF16", "F8_E4M3", ...
std::optional<DType> dtype_from_name(std::string_view name);  // inverse of dtype_name
std::string shape_string(const std::vector<int64_t>& shape);  // "[3, 4]"

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the data section

  int64_t numel() const;   // product of shape (1 for a scalar)
  uint64_t nbytes() const; // numel() * dtype_size(dtype) == end - begin once validated
};

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates the whole header; tensor bytes are not touched.
  static SafetensorsFile open(const std::string& path);
  // Same validation on an owned in-memory buffer (errors name "<memory>").
  static SafetensorsFile from_memory(std::vector<std::byte> data);

  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;          // throws if unknown
  std::span<const std::byte> bytes(const std::string& name) const; // throws if unknown
  std::vector<std::string> names() const;                          // sorted
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t size() const { return tensors_.size(); }
  const std::string& source() const { return source_; }            // path or "<memory>"
  uint64_t data_offset() const { return data_offset_; }            // 8 + header length

 private:
  struct Unmap {  // the mapping's deleter; makes the file move-only
    size_t len;
    void operator()(void* addr) const;
  };

  SafetensorsFile() = default;
  const std::byte* base() const { return map_ ? static_cast<const std::byte*>(map_.get()) : owned_.data(); }
  void parse(size_t file_size);  // validates and fills tensors_/metadata_

  std::string source_;
  std::unique_ptr<void, Unmap> map_;
  std::vector<std::byte> owned_;
  uint64_t data_offset_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Bytes a write of `path` may fill: those free to an unprivileged user on its filesystem (statvfs of
// its directory), plus a stale "<path>.tmp" that the write replaces; nullopt, errno telling why, when
// the directory cannot be measured. STREAMPLAN_FREE_BYTES_FOR_TESTS replaces the measured free space.
std::optional<uint64_t> free_bytes_for(const std::string& path);

class SafetensorsStreamWriter;

class SafetensorsWriter {
 public:
  // Copies `data`. Throws SafetensorsError on a duplicate or reserved name, a negative
  // dimension, or when numel(shape) * dtype_size(dtype) != data.size().
  void add(std::string name, DType dtype, std::vector<int64_t> shape,
           std::span<const std::byte> data);
  void set_metadata(std::string key, std::string value);
  // Full file image: 8-byte LE header length, JSON header padded with spaces to a
  // multiple of 8, then the tensors contiguously in insertion order.
  std::vector<std::byte> serialize() const;
  // Writes path + ".tmp", fsyncs, renames onto `path`; never leaves a partial file.
  // Same checks as SafetensorsStreamWriter::open (header limit, free disk space).
  void write(const std::string& path) const;

 private:
  struct Entry {
    TensorInfo info;
    std::vector<std::byte> data;
  };
  void declare_all(SafetensorsStreamWriter& s) const;

  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file whose tensors are produced one at a time (memory bounded by the
// largest tensor). The file goes to path + ".tmp", renamed onto `path` by commit(); without
// commit() the destructor removes the temp file, so a failed write leaves no partial file.
class SafetensorsStreamWriter {
 public:
  SafetensorsStreamWriter() = default;
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;
  ~SafetensorsStreamWriter();

  // Throws SafetensorsError on a bad or repeated name, a bad shape, or once the header passes
  // kMaxHeaderBytes (an absurd tensor count fails before it fills memory). Only before open().
  void declare(std::string name, DType dtype, std::vector<int64_t> shape);
  void set_metadata(std::string key, std::string value);  // only before open()

  size_t count() const { return tensors_.size(); }
  const std::deque<TensorInfo>& tensors() const { return tensors_; }  // offsets filled in
  // 8-byte LE length + JSON header padded with spaces to a multiple of 8; the same image
  // SafetensorsWriter::serialize() starts with.
  std::string header() const;
  uint64_t header_bytes() const;
  uint64_t file_bytes() const { return header_bytes() + data_bytes_; }

  // Creates path + ".tmp" and writes the header. Throws SafetensorsError, having written
  // nothing, when the header passes kMaxHeaderBytes or file_bytes() exceeds free_bytes_for(path).
  void open(const std::string& path);
  // The bytes of the next declared tensor (declaration order); the size must match.
  void write(std::span<const std::byte> data);
  size_t written() const { return next_; }
  uint64_t bytes_written() const { return bytes_written_; }  // header included
  // Requires every tensor written; flushes, fsyncs and renames onto the path.
  void commit();

 private:
  void put(const void* p, size_t n);
  void flush();
  void write_all(const char* p, size_t n);
  [[noreturn]] void fail(const std::string& what);  // closes and removes the temp file, throws "<path>: what"

  std::deque<TensorInfo> tensors_;  // a deque: names_ views their names, which must not move
  std::unordered_set<std::string_view> names_;
  std::string entries_json_;  // ',"name":{...}' per tensor, in declaration order
  std::map<std::string, std::string> metadata_;
  std::string metadata_json_;  // metadata_ as the header writes it; empty without metadata
  uint64_t data_bytes_ = 0;

  std::string path_, tmp_;
  int fd_ = -1;
  size_t next_ = 0;
  uint64_t bytes_written_ = 0;
  std::vector<char> buffer_;  // coalesces small tensors into fewer write(2) calls
};

}  // namespace sp::io
