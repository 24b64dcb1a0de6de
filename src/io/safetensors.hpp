// Memory-mapped, lazy, fully validating safetensors reader and a simple writer.
//
// Reading:
//   auto f = sp::io::SafetensorsFile::open("model.safetensors");  // mmap + header validation
//   for (const auto& name : f.names()) {
//     const sp::io::TensorInfo& t = f.info(name);                 // dtype, shape, offsets
//     std::span<const std::byte> raw = f.bytes(name);             // view into the mapping
//   }
//
// Writing (atomic: goes to path + ".tmp", then rename):
//   sp::io::SafetensorsWriter w;
//   w.add("fc.weight", sp::io::DType::BF16, {4, 8}, std::as_bytes(std::span(buf)));
//   w.set_metadata("format", "pt");
//   w.write("out.safetensors");
//
// Every malformation is reported as sp::io::SafetensorsError whose message starts with
// the file path (or "<memory>") and names the tensor and the offending values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sp::io {

class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);                     // "BF16", "F8_E4M3", ...
std::optional<DType> dtype_from_name(std::string_view name);  // inverse of dtype_name

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

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile() = default;

  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;          // throws if unknown
  std::span<const std::byte> bytes(const std::string& name) const; // throws if unknown
  std::vector<std::string> names() const;                          // sorted
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t size() const { return tensors_.size(); }
  const std::string& source() const { return source_; }            // path or "<memory>"
  uint64_t data_offset() const { return data_offset_; }            // 8 + header length

 private:
  // Owns an mmap'ed region; unmaps on destruction; move-only.
  class Mapping {
   public:
    Mapping() = default;
    Mapping(void* addr, size_t len) : addr_(addr), len_(len) {}
    Mapping(Mapping&& o) noexcept : addr_(o.addr_), len_(o.len_) { o.addr_ = nullptr; o.len_ = 0; }
    Mapping& operator=(Mapping&& o) noexcept;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping();
    const std::byte* data() const { return static_cast<const std::byte*>(addr_); }

   private:
    void* addr_ = nullptr;
    size_t len_ = 0;
  };

  SafetensorsFile() = default;
  const std::byte* base() const { return map_.data() ? map_.data() : owned_.data(); }
  void parse(size_t file_size);  // validates and fills tensors_/metadata_

  std::string source_;
  Mapping map_;
  std::vector<std::byte> owned_;
  uint64_t data_offset_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

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
  void write(const std::string& path) const;

 private:
  struct Entry {
    TensorInfo info;
    std::vector<std::byte> data;
  };
  std::string header() const;

  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace sp::io
