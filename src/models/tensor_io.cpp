#include "models/tensor_io.hpp"

#include <cstring>
#include <stdexcept>

namespace sp::models {

namespace {

at::ScalarType to_aten(io::DType d, const std::string& name) {
  switch (d) {
    case io::DType::F64: return at::kDouble;
    case io::DType::F32: return at::kFloat;
    case io::DType::F16: return at::kHalf;
    case io::DType::BF16: return at::kBFloat16;
    case io::DType::F8_E4M3: return at::kFloat8_e4m3fn;
    case io::DType::F8_E5M2: return at::kFloat8_e5m2;
    case io::DType::I64: return at::kLong;
    case io::DType::I32: return at::kInt;
    case io::DType::I16: return at::kShort;
    case io::DType::I8: return at::kChar;
    case io::DType::U8: return at::kByte;
    case io::DType::BOOL: return at::kBool;
  }
  throw std::invalid_argument("tensor '" + name + "': unsupported dtype");
}

}  // namespace

io::DType to_io(at::ScalarType t, const std::string& name) {
  switch (t) {
    case at::kDouble: return io::DType::F64;
    case at::kFloat: return io::DType::F32;
    case at::kHalf: return io::DType::F16;
    case at::kBFloat16: return io::DType::BF16;
    case at::kFloat8_e4m3fn: return io::DType::F8_E4M3;
    case at::kFloat8_e5m2: return io::DType::F8_E5M2;
    case at::kLong: return io::DType::I64;
    case at::kInt: return io::DType::I32;
    case at::kShort: return io::DType::I16;
    case at::kChar: return io::DType::I8;
    case at::kByte: return io::DType::U8;
    case at::kBool: return io::DType::BOOL;
    default: break;
  }
  throw std::invalid_argument("tensor '" + name + "': dtype " + std::string(c10::toString(t)) +
                              " cannot be stored in safetensors");
}

at::Tensor read_tensor(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorInfo& info = f.info(name);
  const auto bytes = f.bytes(name);
  at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(to_aten(info.dtype, name)));
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

TensorMap read_tensors(const std::string& path) {
  const auto f = io::SafetensorsFile::open(path);
  TensorMap out;
  for (const auto& n : f.names()) out[n] = read_tensor(f, n);
  return out;
}

void add_tensor(io::SafetensorsWriter& w, const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.detach().cpu().contiguous();
  w.add(name, to_io(c.scalar_type(), name), c.sizes().vec(),
        std::span<const std::byte>(static_cast<const std::byte*>(c.data_ptr()), c.nbytes()));
}

void write_tensors(const std::string& path, const TensorMap& tensors, const std::map<std::string, std::string>& metadata) {
  io::SafetensorsWriter w;
  for (const auto& [k, v] : metadata) w.set_metadata(k, v);
  for (const auto& [name, t] : tensors) add_tensor(w, name, t);
  w.write(path);
}

}  // namespace sp::models
