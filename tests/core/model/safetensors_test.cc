#include "core/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/model/safetensors_writer.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = glmserve::testing::MakeTempDir("safetensors_test_"); }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  static void WriteBytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  static std::string ReadBytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  static std::string LengthPrefix(uint64_t n) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return s;
  }

  // A file image: the true header length, `header`, then `data_bytes` bytes of data.
  static std::string Image(const std::string& header, size_t data_bytes) {
    return LengthPrefix(header.size()) + header + std::string(data_bytes, '\x11');
  }

  // Opens a hand-made image and returns the error message (the test fails if it opens).
  std::string OpenError(const std::string& image) {
    const std::string path = Path("hostile.safetensors");
    WriteBytes(path, image);
    absl::StatusOr<TensorStore> store = TensorStore::OpenFile(path);
    EXPECT_FALSE(store.ok()) << "opened: " << image.substr(8);
    return store.ok() ? "" : std::string(store.status().message());
  }

  std::string dir_;
};

TEST_F(SafetensorsTest, RoundTripsEveryDType) {
  std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, 1e-30f, -7.0f};
  std::vector<uint16_t> bf16 = {FloatToBf16(1.0f), FloatToBf16(-0.5f), FloatToBf16(3.25f)};
  std::vector<uint16_t> f16 = {FloatToF16(0.1f), FloatToF16(-65504.f), FloatToF16(6e-8f),
                               FloatToF16(2.0f), FloatToF16(1.0f)};
  std::vector<TensorToWrite> tensors = {
      {"b.bf16", DType::kBF16, {3}, {{bf16.data(), 6}}},
      {"a.f32", DType::kF32, {2, 3}, {{f32.data(), 24}}},
      // Two pieces are concatenated.
      {"c.f16", DType::kF16, {5}, {{f16.data(), 4}, {f16.data() + 2, 6}}},
      {"empty", DType::kF32, {0, 4}, {}},
      {"scalar", DType::kF32, {}, {{f32.data() + 2, 4}}},
  };
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  // The header is space-padded so that the data section is 8-byte aligned.
  const std::string bytes = ReadBytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_THAT(bytes.substr(8, header_len), HasSubstr("\"__metadata__\":{\"format\":\"pt\"}"));

  absl::StatusOr<TensorStore> store = TensorStore::OpenFile(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(store->Names(),
            (std::vector<std::string>{"a.f32", "b.bf16", "c.f16", "empty", "scalar"}));
  EXPECT_EQ(store->Owners().size(), 1u);

  const TensorInfo* a = store->Find("a.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->bytes, 24);
  EXPECT_EQ(a->num_elements(), 6);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 4, 0u);
  EXPECT_EQ(std::memcmp(a->data, f32.data(), 24), 0);

  const TensorInfo* b = store->Find("b.bf16");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp(b->data, bf16.data(), 6), 0);
  EXPECT_FLOAT_EQ(LoadAsFloat(b->data, b->dtype, 2), 3.25f);

  const TensorInfo* c = store->Find("c.f16");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, DType::kF16);
  std::vector<uint16_t> expect_c = {f16[0], f16[1], f16[2], f16[3], f16[4]};
  EXPECT_EQ(std::memcmp(c->data, expect_c.data(), 10), 0);
  EXPECT_FLOAT_EQ(LoadAsFloat(c->data, c->dtype, 1), -65504.f);

  EXPECT_EQ(store->Find("empty")->bytes, 0);
  EXPECT_EQ(store->Find("scalar")->shape.size(), 0u);
  EXPECT_EQ(store->Find("scalar")->num_elements(), 1);
  EXPECT_EQ(store->Find("missing"), nullptr);
}

TEST_F(SafetensorsTest, ViewsOutliveTheStore) {
  std::vector<float> v = {1, 2, 3, 4};
  ASSERT_TRUE(
      WriteSafetensors(Path("m.safetensors"), {{"t", DType::kF32, {4}, {{v.data(), 16}}}}).ok());
  std::vector<std::shared_ptr<const void>> owners;
  const void* data = nullptr;
  {
    absl::StatusOr<TensorStore> store = TensorStore::OpenFile(Path("m.safetensors"));
    ASSERT_TRUE(store.ok());
    owners = store->Owners();
    data = store->Find("t")->data;
  }
  EXPECT_EQ(static_cast<const float*>(data)[3], 4.0f);
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  std::vector<float> v = {1, 2};
  EXPECT_FALSE(WriteSafetensors(Path("x"), {{"t", DType::kF32, {3}, {{v.data(), 8}}}}).ok());
  EXPECT_FALSE(WriteSafetensors(Path("x"), {{"t", DType::kF32, {1}, {{v.data(), 4}}},
                                            {"t", DType::kF32, {1}, {{v.data(), 4}}}})
                   .ok());
  EXPECT_FALSE(WriteSafetensors(Path("x"), {{"", DType::kF32, {1}, {{v.data(), 4}}}}).ok());
}

TEST_F(SafetensorsTest, MetadataIsIgnored) {
  const std::string header =
      R"({"__metadata__":{"format":"pt","anything":"goes"},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  WriteBytes(Path("m.safetensors"), Image(header, 8));
  absl::StatusOr<TensorStore> store = TensorStore::OpenFile(Path("m.safetensors"));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(store->Names(), std::vector<std::string>{"t"});
}

TEST_F(SafetensorsTest, TooSmallFiles) {
  EXPECT_THAT(OpenError(""), HasSubstr("too small"));
  EXPECT_THAT(OpenError("\x05\x00\x00"), HasSubstr("too small"));
}

TEST_F(SafetensorsTest, HeaderLengthLies) {
  const std::string header = R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_THAT(OpenError(LengthPrefix(header.size() + 100) + header + "abcd"),
              HasSubstr("runs past the end of the file"));
  EXPECT_THAT(OpenError(LengthPrefix(~0ull) + header), HasSubstr("exceeds the limit"));
  EXPECT_THAT(OpenError(LengthPrefix(kMaxSafetensorsHeaderBytes + 1) + header),
              HasSubstr("exceeds the limit"));
  // A length that cuts the JSON short.
  EXPECT_THAT(OpenError(LengthPrefix(10) + header + "abcd"), HasSubstr("not valid JSON"));
}

TEST_F(SafetensorsTest, TruncatedFile) {
  std::vector<float> v(64, 1.0f);
  ASSERT_TRUE(
      WriteSafetensors(Path("m.safetensors"), {{"weights", DType::kF32, {8, 8}, {{v.data(), 256}}}})
          .ok());
  const std::string full = ReadBytes(Path("m.safetensors"));
  const std::string message = OpenError(full.substr(0, full.size() - 3));
  EXPECT_THAT(message, HasSubstr("'weights'"));
  EXPECT_THAT(message, HasSubstr("past the end of the data section"));
}

TEST_F(SafetensorsTest, NotJsonOrNotObject) {
  EXPECT_THAT(OpenError(Image("{not json", 0)), HasSubstr("not valid JSON"));
  EXPECT_THAT(OpenError(Image("[1, 2, 3]", 0)), HasSubstr("does not start with '{'"));
  EXPECT_THAT(OpenError(Image(R"( {"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4)),
              HasSubstr("does not start with '{'"));
  EXPECT_THAT(OpenError(Image(std::string("{\"a\xff\":1}"), 0)), HasSubstr("not valid JSON"));
  EXPECT_THAT(OpenError(Image(R"({"t": 5})", 0)), HasSubstr("'t': header entry is not"));
}

TEST_F(SafetensorsTest, MissingFields) {
  EXPECT_THAT(OpenError(Image(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4)),
              HasSubstr("'t': missing field 'dtype'"));
  EXPECT_THAT(OpenError(Image(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", 4)),
              HasSubstr("'t': missing field 'shape'"));
  EXPECT_THAT(OpenError(Image(R"({"t":{"dtype":"F32","shape":[1]}})", 4)),
              HasSubstr("'t': missing field 'data_offsets'"));
  EXPECT_THAT(OpenError(Image(R"({"t":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4)),
              HasSubstr("'dtype' is not a string"));
  EXPECT_THAT(OpenError(Image(R"({"t":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", 4)),
              HasSubstr("'shape' is not an array"));
}

TEST_F(SafetensorsTest, UnsupportedDType) {
  const std::string message =
      OpenError(Image(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8));
  EXPECT_THAT(message, HasSubstr("'ids'"));
  EXPECT_THAT(message, HasSubstr("I64"));
}

TEST_F(SafetensorsTest, BadDims) {
  EXPECT_THAT(OpenError(Image(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)),
              HasSubstr("not a non-negative integer"));
  EXPECT_THAT(OpenError(Image(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4)),
              HasSubstr("not a non-negative integer"));
  EXPECT_THAT(OpenError(Image(R"({"t":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8)),
              HasSubstr("not a non-negative integer"));
  EXPECT_THAT(
      OpenError(
          Image(R"({"t":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4)),
      HasSubstr("not a non-negative integer"));
  EXPECT_THAT(
      OpenError(Image(
          R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", 4)),
      HasSubstr("overflows"));
  // Product fits int64 but the byte count does not.
  EXPECT_THAT(
      OpenError(
          Image(R"({"t":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]}})", 4)),
      HasSubstr("overflows"));
}

TEST_F(SafetensorsTest, BadOffsets) {
  auto entry = [](const std::string& offsets) {
    return Image(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":)" + offsets + "}}", 8);
  };
  EXPECT_THAT(OpenError(entry("[0]")), HasSubstr("not a [begin, end] pair"));
  EXPECT_THAT(OpenError(entry("[0,4,8]")), HasSubstr("not a [begin, end] pair"));
  EXPECT_THAT(OpenError(entry("{\"a\":1}")), HasSubstr("not a [begin, end] pair"));
  EXPECT_THAT(OpenError(entry("[-8,0]")), HasSubstr("non-negative integers"));
  EXPECT_THAT(OpenError(entry("[8,0]")), HasSubstr("begin 8 > end 0"));
  EXPECT_THAT(OpenError(entry("[8,16]")), HasSubstr("past the end of the data section"));
  EXPECT_THAT(OpenError(entry("[0,18446744073709551615]")), HasSubstr("non-negative integers"));
  EXPECT_THAT(OpenError(entry("[0,9223372036854775807]")),
              HasSubstr("past the end of the data section"));
  const std::string mismatch = OpenError(entry("[0,4]"));
  EXPECT_THAT(mismatch, HasSubstr("'t'"));
  EXPECT_THAT(mismatch, HasSubstr("cover 4 bytes but F32 [2] needs 8"));
}

TEST_F(SafetensorsTest, OverlappingRanges) {
  const std::string message =
      OpenError(Image(R"({"first":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("second":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      12));
  EXPECT_THAT(message, HasSubstr("'first'"));
  EXPECT_THAT(message, HasSubstr("'second'"));
  EXPECT_THAT(message, HasSubstr("overlapping"));
  // Same range twice.
  EXPECT_THAT(OpenError(Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}})",
                              8)),
              HasSubstr("overlapping"));
  // An empty tensor sits between others, never inside one (as the reference requires).
  WriteBytes(Path("ok.safetensors"),
             Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
                   8));
  EXPECT_TRUE(TensorStore::OpenFile(Path("ok.safetensors")).ok());
  EXPECT_THAT(OpenError(Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                              8)),
              HasSubstr("overlapping"));
}

// The tensors must tile the data section exactly: a gap, trailing bytes or a header length
// that is off by a byte (every tensor read shifted) are refused.
TEST_F(SafetensorsTest, DataSectionExactlyCovered) {
  EXPECT_THAT(OpenError(Image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)),
              HasSubstr("bytes [0, 4) of the data section belong to no tensor"));
  EXPECT_THAT(OpenError(Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                              12)),
              HasSubstr("bytes [4, 8) of the data section belong to no tensor (before 'b')"));
  EXPECT_THAT(OpenError(Image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 5)),
              HasSubstr("the tensors cover 4 bytes but the data section has 5"));
  // A real file whose header length is one byte short: the JSON still parses (the last
  // padding space is cut) but the data section starts a byte early.
  std::vector<float> v = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE(
      WriteSafetensors(Path("m.safetensors"), {{"w", DType::kF32, {3}, {{v.data(), 12}}}}).ok());
  std::string bytes = ReadBytes(Path("m.safetensors"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  ASSERT_EQ(bytes[8 + header_len - 1], ' ') << "the writer pads the header";
  const std::string shifted = LengthPrefix(header_len - 1) + bytes.substr(8);
  EXPECT_THAT(OpenError(shifted),
              HasSubstr("the tensors cover 12 bytes but the data section has 13"));
}

// A FIFO (or any non-regular file) in place of a weights file is refused at once instead of
// blocking the loader forever waiting for a writer.
TEST_F(SafetensorsTest, OnlyRegularFiles) {
  ASSERT_EQ(::mkfifo(Path("fifo.safetensors").c_str(), 0600), 0);
  absl::StatusOr<TensorStore> store = TensorStore::OpenFile(Path("fifo.safetensors"));
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("not a regular file"));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  // A directory named like the weights file.
  ASSERT_EQ(::mkdir(Path("d").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir(Path("d/model.safetensors").c_str(), 0700), 0);
  store = TensorStore::Open(Path("d"));
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("not a regular file"));
  // A FIFO as the shard index.
  ASSERT_EQ(::mkdir(Path("e").c_str(), 0700), 0);
  ASSERT_EQ(::mkfifo(Path("e/model.safetensors.index.json").c_str(), 0600), 0);
  store = TensorStore::Open(Path("e"));
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("not a regular file"));
}

TEST_F(SafetensorsTest, DuplicateNames) {
  const std::string message =
      OpenError(Image(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      8));
  EXPECT_THAT(message, HasSubstr("'w' appears twice"));
}

// Every truncation and many random corruptions of a valid file either open or fail cleanly
// (run under ASan to catch out-of-bounds reads).
TEST_F(SafetensorsTest, CorruptionsNeverCrash) {
  std::vector<uint16_t> a(37, 0x3f80);
  std::vector<float> b(10, 2.0f);
  ASSERT_TRUE(
      WriteSafetensors(Path("m.safetensors"), {{"model.a", DType::kBF16, {37}, {{a.data(), 74}}},
                                               {"model.b", DType::kF32, {2, 5}, {{b.data(), 40}}}})
          .ok());
  const std::string full = ReadBytes(Path("m.safetensors"));
  for (size_t n = 0; n < full.size(); ++n) {
    const std::string part = full.substr(0, n);
    EXPECT_FALSE(ParseSafetensors(part.data(), part.size(), "cut").ok()) << n;
  }
  std::mt19937 rng(7);
  int opened = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string copy = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      // Mostly in the length and header, where the parser looks.
      const size_t at = rng() % std::min<size_t>(copy.size(), 8 + 200);
      copy[at] = static_cast<char>(rng() & 0xff);
    }
    // A heap copy of exactly the right size, so ASan sees any overrun.
    std::vector<char> buffer(copy.begin(), copy.end());
    absl::StatusOr<std::vector<TensorInfo>> parsed =
        ParseSafetensors(buffer.data(), buffer.size(), "fuzz");
    if (!parsed.ok()) continue;
    ++opened;
    for (const TensorInfo& t : *parsed) {
      const char* p = static_cast<const char*>(t.data);
      ASSERT_GE(p, buffer.data());
      ASSERT_LE(p + t.bytes, buffer.data() + buffer.size());
    }
  }
  EXPECT_GT(opened, 0);  // some corruptions (e.g. inside a name) are still valid files
}

class ShardedTest : public SafetensorsTest {
 protected:
  void WriteShards() {
    ASSERT_TRUE(WriteSafetensors(Path("model-00001-of-00002.safetensors"),
                                 {{"x", DType::kF32, {2}, {{v_.data(), 8}}},
                                  {"y", DType::kF32, {1}, {{v_.data() + 2, 4}}}})
                    .ok());
    ASSERT_TRUE(WriteSafetensors(Path("model-00002-of-00002.safetensors"),
                                 {{"z", DType::kF32, {3}, {{v_.data() + 3, 12}}}})
                    .ok());
  }
  void WriteIndex(const std::string& weight_map) {
    WriteBytes(Path("model.safetensors.index.json"),
               R"({"metadata":{"total_size":24},"weight_map":)" + weight_map + "}");
  }
  std::string OpenDirError() {
    absl::StatusOr<TensorStore> store = TensorStore::Open(dir_);
    EXPECT_FALSE(store.ok());
    return store.ok() ? "" : std::string(store.status().message());
  }
  std::vector<float> v_ = {1, 2, 3, 4, 5, 6};
};

TEST_F(ShardedTest, OpensEachShardOnce) {
  WriteShards();
  WriteIndex(R"({"x":"model-00001-of-00002.safetensors","y":"model-00001-of-00002.safetensors",)"
             R"("z":"model-00002-of-00002.safetensors"})");
  absl::StatusOr<TensorStore> store = TensorStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(store->Names(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(store->Owners().size(), 2u);
  EXPECT_EQ(static_cast<const float*>(store->Find("z")->data)[2], 6.0f);
  EXPECT_EQ(static_cast<const float*>(store->Find("y")->data)[0], 3.0f);
}

TEST_F(ShardedTest, IndexIsTheAuthority) {
  WriteShards();
  // y is in shard 1 but not in the index: it is not part of the checkpoint.
  WriteIndex(R"({"x":"model-00001-of-00002.safetensors","z":"model-00002-of-00002.safetensors"})");
  absl::StatusOr<TensorStore> store = TensorStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(store->Names(), (std::vector<std::string>{"x", "z"}));
}

TEST_F(ShardedTest, MissingShard) {
  WriteShards();
  WriteIndex(R"({"x":"model-00001-of-00002.safetensors","w":"model-00009.safetensors"})");
  const std::string message = OpenDirError();
  EXPECT_THAT(message, HasSubstr("model-00009.safetensors"));
  EXPECT_THAT(message, HasSubstr("'w'"));
}

TEST_F(ShardedTest, TensorNotInNamedShard) {
  WriteShards();
  WriteIndex(R"({"x":"model-00001-of-00002.safetensors","z":"model-00001-of-00002.safetensors"})");
  const std::string message = OpenDirError();
  EXPECT_THAT(message, HasSubstr("'z' is not in its shard 'model-00001-of-00002.safetensors'"));
}

TEST_F(ShardedTest, PathTraversal) {
  WriteShards();
  for (const char* bad : {"../model-00001-of-00002.safetensors", "/etc/passwd",
                          "sub/model.safetensors", "..", ".", "", "a\\\\b"}) {
    WriteIndex(std::string(R"({"x":")") + bad + "\"}");
    EXPECT_THAT(OpenDirError(), HasSubstr("not a plain file name")) << bad;
  }
}

TEST_F(ShardedTest, BadIndex) {
  WriteShards();
  WriteBytes(Path("model.safetensors.index.json"), "{oops");
  EXPECT_THAT(OpenDirError(), HasSubstr("not a JSON object"));
  WriteBytes(Path("model.safetensors.index.json"), R"({"metadata":{}})");
  EXPECT_THAT(OpenDirError(), HasSubstr("weight_map"));
  WriteIndex(R"({"x":5})");
  EXPECT_THAT(OpenDirError(), HasSubstr("'x' is not a file name string"));
  // A corrupt shard is reported with its path.
  WriteBytes(Path("model-00002-of-00002.safetensors"), "garbage");
  WriteIndex(R"({"z":"model-00002-of-00002.safetensors"})");
  EXPECT_THAT(OpenDirError(), HasSubstr("model-00002-of-00002.safetensors: file is 7 bytes"));
}

TEST_F(SafetensorsTest, OpenDirectoryWithoutWeights) {
  absl::StatusOr<TensorStore> store = TensorStore::Open(dir_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(store.status().message(), HasSubstr("model.safetensors"));
  EXPECT_EQ(TensorStore::OpenFile(Path("nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(TensorStore::OpenFile(dir_).ok());  // a directory is not a file
}

TEST_F(SafetensorsTest, SingleFileInDirectory) {
  std::vector<float> v = {1, 2};
  ASSERT_TRUE(
      WriteSafetensors(Path("model.safetensors"), {{"t", DType::kF32, {2}, {{v.data(), 8}}}}).ok());
  absl::StatusOr<TensorStore> store = TensorStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(store->size(), 1u);
}

}  // namespace
}  // namespace glmserve
