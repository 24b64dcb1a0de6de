#include "models/tensor_io.hpp"

#include <cstring>
#include <stdexcept>
#include <utility>

namespace sp::models {

namespace {

constexpr std::pair<io::DType, at::ScalarType> kDtypes[] = {
    {io::DType::F64, at::kDouble},          {io::DType::F32, at::kFloat},         {io::DType::F16, at::kHalf},
    {io::DType::BF16, at::kBFloat16},       {io::DType::F8_E4M3, at::kFloat8_e4m3fn},
    {io::DType::F8_E5M2, at::kFloat8_e5m2}, {io::DType::I64, at::kLong},          {io::DType::I32, at::kInt},
    {io::DType::I16, at::kShort},           {io::DType::I8, at::kChar},           {io::DType::U8, at::kByte},
    {io::DType::BOOL, at::kBool},
};

}  // namespace

at::ScalarType to_aten(io::DType d, const std::string& name) {
  for (const auto& [io_dtype, aten] : kDtypes)
    if (io_dtype == d) return aten;
  throw std::invalid_argument("tensor '" + name + "': unsupported dtype");
}

io::DType to_io(at::ScalarType t, const std::string& name) {
  for (const auto& [io_dtype, aten] : kDtypes)
    if (aten == t) return io_dtype;
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

void write_tensors(const std::string& path, const TensorMap& tensors, const std::map<std::string, std::string>& metadata) {
  io::SafetensorsWriter w;
  for (const auto& [k, v] : metadata) w.set_metadata(k, v);
  for (const auto& [name, t] : tensors) {
    const at::Tensor c = t.detach().cpu().contiguous();
    w.add(name, to_io(c.scalar_type(), name), c.sizes().vec(),
          std::span<const std::byte>(static_cast<const std::byte*>(c.data_ptr()), c.nbytes()));
  }
  w.write(path);
}

}  // namespace sp::models
