// libFuzzer target for the safetensors reader (see fuzz/run.sh).
//
// Properties checked on every input:
//  * parsing either succeeds or throws sp::io::SafetensorsError; anything else (another
//    exception type, an ASan/UBSan report, a timeout) is a bug;
//  * an accepted file has in-bounds, non-overlapping tensors whose byte spans match
//    shape x dtype size;
//  * re-serializing an accepted file with SafetensorsWriter and parsing it again gives
//    the same tensors, bytes and metadata.
#include "io/safetensors.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sp::io;
  std::vector<std::byte> buf(size);
  if (size) std::memcpy(buf.data(), data, size);
  try {
    const SafetensorsFile f = SafetensorsFile::from_memory(std::move(buf));
    const uint64_t data_size = size - f.data_offset();
    SafetensorsWriter w;
    for (const auto& name : f.names()) {
      const TensorInfo& t = f.info(name);
      auto b = f.bytes(name);
      check(t.begin <= t.end && t.end <= data_size, "range inside data section");
      check(b.size() == t.nbytes(), "span size == shape x dtype size");
      unsigned sum = 0;  // touch every byte so ASan sees any out-of-bounds view
      for (std::byte x : b) sum += std::to_integer<unsigned>(x);
      (void)sum;
      w.add(name, t.dtype, t.shape, b);
    }
    for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);

    const SafetensorsFile g = SafetensorsFile::from_memory(w.serialize());
    check(g.names() == f.names(), "round trip keeps names");
    check(g.metadata() == f.metadata(), "round trip keeps metadata");
    for (const auto& name : f.names()) {
      const TensorInfo &a = f.info(name), &b = g.info(name);
      check(a.dtype == b.dtype && a.shape == b.shape, "round trip keeps dtype/shape");
      auto x = f.bytes(name), y = g.bytes(name);
      check(std::equal(x.begin(), x.end(), y.begin(), y.end()), "round trip keeps bytes");
    }
  } catch (const SafetensorsError&) {
    // Rejected input: fine.
  }
  return 0;
}
