#include "io/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using sp::io::DType;
using sp::io::SafetensorsError;
using sp::io::SafetensorsFile;
using sp::io::SafetensorsWriter;

namespace {

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("streamplan_io_test_" + std::to_string(rd()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<std::byte> iota_bytes(size_t n, unsigned start = 0) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((start + i) & 0xff);
  return v;
}

// Builds a raw file image: 8-byte LE length + header text + data bytes.
std::vector<std::byte> raw_file(const std::string& header, size_t data_bytes = 0) {
  std::vector<std::byte> out(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  auto data = iota_bytes(data_bytes);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_bytes(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Runs `fn`, expects a SafetensorsError whose message contains every needle.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected SafetensorsError";
  } catch (const SafetensorsError& e) {
    const std::string msg = e.what();
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message lacks \"" << n << "\": " << msg;
  }
}

// A malformed image must fail identically from memory and from a file on disk, and the
// message must start with the source name.
void expect_bad(const std::string& header, size_t data_bytes, std::vector<std::string> needles) {
  const auto img = raw_file(header, data_bytes);
  needles.push_back("<memory>: ");
  expect_error([&] { SafetensorsFile::from_memory(img); }, needles);
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  write_bytes(p, img);
  needles.back() = p + ": ";
  expect_error([&] { SafetensorsFile::open(p); }, needles);
}

}  // namespace

TEST(Safetensors, DTypeTable) {
  EXPECT_EQ(sp::io::dtype_size(DType::BF16), 2u);
  EXPECT_EQ(sp::io::dtype_size(DType::F8_E5M2), 1u);
  EXPECT_EQ(sp::io::dtype_size(DType::I64), 8u);
  EXPECT_EQ(sp::io::dtype_name(DType::F8_E4M3), "F8_E4M3");
  EXPECT_EQ(sp::io::dtype_from_name("BOOL"), DType::BOOL);
  EXPECT_FALSE(sp::io::dtype_from_name("bf16").has_value());
}

TEST(Safetensors, RoundTripSeveralDTypes) {
  TempDir dir;
  const std::string path = dir.file("rt.safetensors");
  auto a = iota_bytes(2 * 3 * 2, 1);  // BF16 [2,3]
  auto b = iota_bytes(5, 7);          // F8_E4M3 [5]
  auto c = iota_bytes(4, 100);        // I8 [2,2]
  auto d = iota_bytes(3 * 4, 9);      // F32 [3]
  auto s = iota_bytes(8, 42);         // I64 scalar []
  SafetensorsWriter w;
  w.add("layer.0.weight", DType::BF16, {2, 3}, a);
  w.add("fp8", DType::F8_E4M3, {5}, b);
  w.add("empty", DType::F32, {0, 7}, {});
  w.add("int8", DType::I8, {2, 2}, c);
  w.add("f32", DType::F32, {3}, d);
  w.add("scalar", DType::I64, {}, s);
  w.set_metadata("format", "pt");
  w.write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f.size(), 6u);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"empty", "f32", "fp8", "int8", "layer.0.weight", "scalar"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.data_offset() % 8, 0u);

  const auto& t = f.info("layer.0.weight");
  EXPECT_EQ(t.dtype, DType::BF16);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 12u);
  EXPECT_EQ(t.begin, 0u);  // insertion order, contiguous
  EXPECT_EQ(f.info("fp8").begin, 12u);
  EXPECT_EQ(f.info("empty").begin, f.info("empty").end);
  EXPECT_EQ(f.info("scalar").numel(), 1);

  auto eq = [](std::span<const std::byte> x, const std::vector<std::byte>& y) {
    return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin());
  };
  EXPECT_TRUE(eq(f.bytes("layer.0.weight"), a));
  EXPECT_TRUE(eq(f.bytes("fp8"), b));
  EXPECT_TRUE(eq(f.bytes("int8"), c));
  EXPECT_TRUE(eq(f.bytes("f32"), d));
  EXPECT_TRUE(eq(f.bytes("scalar"), s));
  EXPECT_EQ(f.bytes("empty").size(), 0u);
  EXPECT_EQ(f.info("int8").dtype, DType::I8);

  // The in-memory path sees the same thing, and serialize() equals the file on disk.
  auto img = w.serialize();
  EXPECT_EQ(fs::file_size(path), img.size());
  auto m = SafetensorsFile::from_memory(img);
  EXPECT_EQ(m.names(), f.names());
  EXPECT_TRUE(eq(m.bytes("fp8"), b));

  // Moving keeps the mapping alive and valid.
  SafetensorsFile moved = std::move(f);
  EXPECT_TRUE(eq(moved.bytes("int8"), c));
}

TEST(Safetensors, LazyBytesComeFromTheMapping) {
  TempDir dir;
  const std::string path = dir.file("lazy.safetensors");
  // A header with a gap between tensors and trailing bytes (both allowed).
  const std::string header =
      R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})";
  write_bytes(path, raw_file(header, 20));
  auto f = SafetensorsFile::open(path);
  auto a = f.bytes("a");
  auto b = f.bytes("b");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(std::to_integer<unsigned>(a[i]), i);
    EXPECT_EQ(std::to_integer<unsigned>(b[i]), 8 + i);
  }
  EXPECT_EQ(reinterpret_cast<const char*>(b.data()) - reinterpret_cast<const char*>(a.data()), 8);
  EXPECT_TRUE(f.contains("a"));
  EXPECT_FALSE(f.contains("c"));
  expect_error([&] { f.bytes("c"); }, {path, "no tensor named 'c'"});
  expect_error([&] { f.info("c"); }, {"'c'"});
}

TEST(Safetensors, EmptyHeaderIsValid) {
  auto f = SafetensorsFile::from_memory(raw_file("{}      "));
  EXPECT_EQ(f.size(), 0u);
  EXPECT_TRUE(f.metadata().empty());
}

TEST(SafetensorsErrors, TruncatedFile) {
  expect_error([] { SafetensorsFile::from_memory(iota_bytes(5)); }, {"<memory>", "5 bytes", "8-byte"});
  TempDir dir;
  write_bytes(dir.file("short"), iota_bytes(3));
  expect_error([&] { SafetensorsFile::open(dir.file("short")); }, {dir.file("short"), "3 bytes"});
  expect_error([&] { SafetensorsFile::open(dir.file("missing")); }, {dir.file("missing"), "cannot open"});
  expect_error([&] { SafetensorsFile::open(dir.path().string()); }, {"not a regular file"});
}

TEST(SafetensorsErrors, TruncatedHeader) {
  auto img = raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  img.resize(30);
  expect_error([&] { SafetensorsFile::from_memory(img); },
               {"header length 53", "exceeds the 22 bytes", "file is 30 bytes"});
}

TEST(SafetensorsErrors, AbsurdHeaderLength) {
  auto img = raw_file("{}");
  img[5] = std::byte{0x7f};
  expect_error([&] { SafetensorsFile::from_memory(img); }, {"header length", "exceeds the limit of 100000000"});
}

TEST(SafetensorsErrors, BadJson) {
  expect_bad(R"({"a":{"dtype":"U8",)", 0, {"header is not valid JSON"});
  expect_bad("{\"a\xff\":1}", 0, {"not valid UTF-8", "offset 3"});
  expect_bad(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{}})", 1,
             {"duplicate key 'a'"});
  expect_bad(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1,
             {"duplicate key 'dtype'"});
  expect_bad("{\"a\":" + std::string(40, '[') + std::string(40, ']') + "}", 0, {"nested deeper"});
}

// Files that are not safetensors at all say so, name the file, and say why, instead of
// quoting the nonsense header length their first 8 bytes give.
TEST(SafetensorsErrors, NotASafetensorsFile) {
  TempDir dir;
  auto expect_not = [&](const std::string& name, const std::vector<std::byte>& bytes,
                        std::vector<std::string> needles) {
    const std::string p = dir.file(name);
    write_bytes(p, bytes);
    needles.push_back("'" + p + "' is not a safetensors file: ");
    expect_error([&] { SafetensorsFile::open(p); }, needles);
    needles.back() = "'<memory>' is not a safetensors file: ";
    expect_error([&] { SafetensorsFile::from_memory(bytes); }, needles);
  };

  std::mt19937 rng(12345);
  std::vector<std::byte> noise(1234);
  for (auto& b : noise) b = static_cast<std::byte>(rng() & 0xff);
  ASSERT_NE(noise[8], std::byte{'{'});
  expect_not("random.bin", noise, {"its first 8 bytes, read as the little-endian header length, give ",
                                   "bytes, but the file has 1234 bytes"});

  const std::string text = "{\n  \"model_type\": \"wan\",\n  \"num_layers\": 30\n}\n";
  std::vector<std::byte> json_doc;
  for (char c : text) json_doc.push_back(static_cast<std::byte>(c));
  expect_not("config.json", json_doc, {"it looks like a JSON document"});

  expect_not("empty.safetensors", {}, {"it is empty"});
  expect_not("short.safetensors", iota_bytes(5), {"it has 5 bytes, fewer than the 8-byte header length"});
  expect_not("one.safetensors", iota_bytes(1), {"it has 1 byte,"});
  expect_not("zip.pt", {std::byte{'P'}, std::byte{'K'}, std::byte{3}, std::byte{4}, std::byte{20}, std::byte{0},
                        std::byte{0}, std::byte{0}, std::byte{8}, std::byte{0}},
             {"zip archive"});

  // A plausible length whose header is not a JSON object, and an empty header.
  expect_not("array.safetensors", raw_file("[1,2,3]"), {"the header does not begin with '{' (it begins with '[')"});
  expect_not("zero.safetensors", raw_file(""), {"header length is 0"});
}

TEST(SafetensorsErrors, EntryNotObjectMissingOrExtraKeys) {
  expect_bad(R"({"w":[1,2]})", 0, {"tensor 'w'", "must be an object", "[1,2]"});
  expect_bad(R"({"w":{"dtype":"U8","shape":[1]}})", 1, {"tensor 'w'", "missing key 'data_offsets'"});
  expect_bad(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1}})", 1,
             {"tensor 'w'", "unexpected key 'extra'"});
}

TEST(SafetensorsErrors, UnknownDType) {
  expect_bad(R"({"blocks.0.w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16,
             {"tensor 'blocks.0.w'", "unknown dtype \"F128\""});
  expect_bad(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4, {"tensor 'w'", "unknown dtype 4"});
}

TEST(SafetensorsErrors, NegativeOrNonIntegerDims) {
  expect_bad(R"({"w":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,0]}})", 0,
             {"tensor 'w'", "shape [2,-3]", "dimension 1 is -3"});
  expect_bad(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,0]}})", 0,
             {"tensor 'w'", "dimension 0 is 2.5"});
  expect_bad(R"({"w":{"dtype":"F32","shape":"2x3","data_offsets":[0,0]}})", 0,
             {"tensor 'w'", "shape must be an array", "\"2x3\""});
  expect_bad(R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,0]}})", 0,
             {"tensor 'w'", "9223372036854775808"});
}

TEST(SafetensorsErrors, NumelOverflow) {
  expect_bad(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0,
             {"tensor 'w'", "[4294967296, 4294967296]", "overflows"});
  expect_bad(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0,
             {"tensor 'w'", "overflows"});
}

TEST(SafetensorsErrors, ShapeDoesNotMatchByteSpan) {
  expect_bad(R"({"blocks.0.fc1.weight":{"dtype":"BF16","shape":[5376,28672],)"
             R"("data_offsets":[0,308281340]}})",
             0,
             {"tensor 'blocks.0.fc1.weight'",
              "shape [5376, 28672] x BF16 (2 bytes) = 308281344 bytes but data_offsets span 308281340 bytes"});
  expect_bad(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,3]}})", 3,
             {"tensor 'w'", "= 12 bytes but data_offsets span 3 bytes"});
}

TEST(SafetensorsErrors, BadDataOffsets) {
  expect_bad(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[4,2]}})", 8,
             {"tensor 'w'", "data_offsets [4, 2]", "begin > end"});
  expect_bad(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", 8,
             {"tensor 'w'", "data_offsets must be [begin, end]", "[0]"});
  expect_bad(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,-2]}})", 8,
             {"tensor 'w'", "[0,-2]"});
}

TEST(SafetensorsErrors, OutOfRangeOffsets) {
  expect_bad(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})", 8,
             {"tensor 'w'", "data_offsets [6, 10]", "past the data section of 8 bytes"});
  expect_bad(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[9,9]}})", 8,
             {"tensor 'w'", "data_offsets [9, 9]"});
}

TEST(SafetensorsErrors, OverlappingRanges) {
  expect_bad(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
             16, {"tensor 'b' data_offsets [4, 12] overlaps tensor 'a' data_offsets [0, 8]"});
  // A range fully inside an earlier, longer one.
  expect_bad(R"({"big":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},)"
             R"("mid":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
             R"("tail":{"dtype":"U8","shape":[2],"data_offsets":[10,12]}})",
             16, {"overlaps tensor 'big'"});
  // Zero-size tensors never overlap anything.
  auto ok = raw_file(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                     R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})", 8);
  EXPECT_NO_THROW(SafetensorsFile::from_memory(ok));
}

TEST(SafetensorsErrors, BadMetadata) {
  expect_bad(R"({"__metadata__":{"format":1}})", 0, {"__metadata__ key 'format'", "got 1"});
  expect_bad(R"({"__metadata__":["x"]})", 0, {"__metadata__ must be an object", "[\"x\"]"});
}

TEST(SafetensorsErrors, ControlCharactersInNamesAreEscaped) {
  expect_bad("{\"a\\nb\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, {"tensor 'a\\x0ab'"});
}

TEST(SafetensorsWriterTest, RefusesMismatchedSizesAndLeavesNoFile) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  SafetensorsWriter w;
  auto data = iota_bytes(10);
  expect_error([&] { w.add("fc1.weight", DType::BF16, {2, 3}, data); },
               {"tensor 'fc1.weight'", "shape [2, 3] x BF16 (2 bytes) = 12 bytes but 10 bytes were given"});
  expect_error([&] { w.add("neg", DType::U8, {-1}, {}); }, {"tensor 'neg'", "[-1]"});
  expect_error([&] { w.add("__metadata__", DType::U8, {0}, {}); }, {"reserved"});
  w.add("ok", DType::U8, {10}, data);
  expect_error([&] { w.add("ok", DType::U8, {10}, data); }, {"tensor 'ok'", "duplicate"});
  EXPECT_FALSE(fs::exists(path));

  // A failing write (destination is a non-empty directory) leaves neither file nor temp.
  fs::create_directories(dir.path() / "dst" / "child");
  const std::string dst = (dir.path() / "dst").string();
  expect_error([&] { w.write(dst); }, {dst, "rename"});
  EXPECT_FALSE(fs::exists(dst + ".tmp"));
  expect_error([&] { w.write(dir.file("no/such/dir/x.safetensors")); }, {"cannot create"});

  // Overwriting an existing file replaces it atomically.
  write_bytes(path, iota_bytes(3));
  w.write(path);
  EXPECT_EQ(SafetensorsFile::open(path).size(), 1u);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(SafetensorsStreamWriterTest, SameBytesAsTheInMemoryWriter) {
  TempDir dir;
  auto a = iota_bytes(2 * 3 * 2, 1);
  auto b = iota_bytes(5, 7);
  SafetensorsWriter w;
  sp::io::SafetensorsStreamWriter s;
  w.add("layer.0.weight", DType::BF16, {2, 3}, a);
  s.declare("layer.0.weight", DType::BF16, {2, 3});
  w.add("empty", DType::F32, {0, 7}, {});
  s.declare("empty", DType::F32, {0, 7});
  w.add("q\"uote\u00e9", DType::U8, {5}, b);
  s.declare("q\"uote\u00e9", DType::U8, {5});
  w.set_metadata("format", "pt");
  s.set_metadata("format", "pt");
  w.set_metadata("a", "x\ny");
  s.set_metadata("a", "x\ny");

  const auto img = w.serialize();
  ASSERT_EQ(s.file_bytes(), img.size());  // known before any tensor exists
  EXPECT_EQ(s.header_bytes() % 8, 0u);
  EXPECT_EQ(s.tensors().at(2).begin, 12u);

  const std::string path = dir.file("s.safetensors");
  s.open(path);
  EXPECT_TRUE(fs::exists(path + ".tmp"));
  EXPECT_FALSE(fs::exists(path));
  s.write(a);
  s.write({});
  s.write(b);
  EXPECT_EQ(s.written(), 3u);
  EXPECT_EQ(s.bytes_written(), img.size());
  s.commit();
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  std::ifstream in(path, std::ios::binary);
  std::vector<char> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(got.size(), img.size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), reinterpret_cast<const char*>(img.data())));
  EXPECT_EQ(SafetensorsFile::open(path).metadata().at("a"), "x\ny");

  // No metadata, no tensors: the header is "{}" padded.
  sp::io::SafetensorsStreamWriter e;
  EXPECT_EQ(e.header(), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
}

TEST(SafetensorsStreamWriterTest, RefusesWhatDoesNotFitAndLeavesNoFile) {
  TempDir dir;
  const std::string path = dir.file("big.safetensors");
  auto declare = [](sp::io::SafetensorsStreamWriter& s) {
    s.declare("w", DType::F32, {1000, 1000});
    s.set_metadata("format", "pt");
  };

  // Not enough free space: refused before anything is created, naming both sizes.
  {
    sp::io::SafetensorsStreamWriter s;
    declare(s);
    const std::string need = std::to_string(s.file_bytes());
    ::setenv("STREAMPLAN_FREE_BYTES_FOR_TESTS", "1000", 1);
    expect_error([&] { s.open(path); }, {path, "the file needs " + need + " bytes", "has 1000 bytes", "free"});
    ::unsetenv("STREAMPLAN_FREE_BYTES_FOR_TESTS");
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // Abandoned half way (an exception in the producer): the destructor removes the temp file.
  {
    sp::io::SafetensorsStreamWriter s;
    declare(s);
    s.declare("v", DType::U8, {4});
    s.open(path);
    s.write(std::vector<std::byte>(4'000'000));
    EXPECT_TRUE(fs::exists(path + ".tmp"));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // A wrong size or an early commit aborts the file.
  {
    sp::io::SafetensorsStreamWriter s;
    declare(s);
    s.open(path);
    expect_error([&] { s.write(iota_bytes(3)); }, {path, "tensor 'w'", "= 4000000 bytes but 3 bytes were given"});
    EXPECT_FALSE(fs::exists(path + ".tmp"));
  }
  {
    sp::io::SafetensorsStreamWriter s;
    declare(s);
    s.open(path);
    expect_error([&] { s.commit(); }, {path, "after 0 of 1 tensors", "'w'"});
    expect_error([&] { s.declare("late", DType::U8, {1}); }, {"after open()"});
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // A header beyond what readers accept is refused up front.
  {
    sp::io::SafetensorsStreamWriter s;
    s.set_metadata("blob", std::string(100'000'000, 'x'));
    expect_error([&] { s.open(path); }, {path, "beyond the limit of 100000000 bytes"});
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // Duplicate and reserved names are refused at declaration.
  sp::io::SafetensorsStreamWriter s;
  s.declare("a", DType::U8, {1});
  expect_error([&] { s.declare("a", DType::U8, {1}); }, {"tensor 'a'", "duplicate"});
  expect_error([&] { s.declare("__metadata__", DType::U8, {1}); }, {"reserved"});
  expect_error([&] { s.declare("n", DType::U8, {-2}); }, {"tensor 'n'", "[-2]"});
}
