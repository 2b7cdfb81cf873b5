// gguf_fill: rebuilds a GGUF file from its header ("skeleton") and the Hugging Face checkpoint
// its tensors were converted from, on a host that cannot run llama.cpp's Python converter (a
// bare GPU host: no PyPI, often no numpy). tools/gguf_manifest.py, run where the converter
// runs, writes the skeleton (every byte before the tensor data: metadata, vocabulary, tensor
// infos) and a manifest saying where each tensor's bytes come from in the checkpoint's
// safetensors files. A preset's checkpoint is the same bytes wherever `glm-run --save` writes
// it (seeded weights, a determinism contract), so the manifest carries over: the manifest's
// header checks pin the checkpoint, and the file this writes is byte-identical to the
// converter's (the script checks that where it runs).
//
//   gguf_fill SKELETON MANIFEST CHECKPOINT_DIR OUT.gguf
//
// Manifest lines (text, one record each):
//   gguf-fill 1 TOTAL_BYTES          the output's size (the skeleton is its first bytes)
//   check FILE BYTES FNV1A64         the first BYTES of FILE (its safetensors header) hash so
//   copy DST FILE SRC BYTES          BYTES of FILE at SRC go to DST of the output
//   f32 DST FILE SRC BYTES           BYTES of bf16 at SRC widen to fp32 at DST (2x BYTES)
// Gaps (alignment padding) stay zero, as the converter writes them.
// Build: c++ -O2 -std=c++17 tools/gguf_fill.cc -o gguf_fill (tools/compare_llamacpp.sh does).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "gguf_fill: %s\n", what.c_str());
  return 1;
}

bool ReadAt(int fd, void* dst, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = pread(fd, p, n, static_cast<off_t>(offset));
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

bool WriteAt(int fd, const void* src, size_t n, uint64_t offset) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    ssize_t put = pwrite(fd, p, n, static_cast<off_t>(offset));
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
    offset += static_cast<uint64_t>(put);
  }
  return true;
}

uint64_t Fnv1a64(const std::vector<char>& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: gguf_fill SKELETON MANIFEST CHECKPOINT_DIR OUT.gguf\n");
    return 2;
  }
  const std::string skeleton_path = argv[1], manifest_path = argv[2], dir = argv[3],
                    out_path = argv[4];
  std::ifstream skeleton(skeleton_path, std::ios::binary);
  std::vector<char> head((std::istreambuf_iterator<char>(skeleton)), {});
  if (!skeleton.good() && !skeleton.eof()) return Fail("cannot read " + skeleton_path);
  std::ifstream manifest(manifest_path);
  if (!manifest) return Fail("cannot read " + manifest_path);

  std::map<std::string, int> sources;  // checkpoint file -> fd
  auto source = [&](const std::string& name) -> int {
    auto it = sources.find(name);
    if (it != sources.end()) return it->second;
    int fd = open((dir + "/" + name).c_str(), O_RDONLY);
    sources[name] = fd;
    return fd;
  };
  int out = open(out_path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (out < 0) return Fail("cannot create " + out_path);

  std::vector<char> buffer, wide;
  constexpr uint64_t kChunk = 64ull << 20;
  std::string line;
  uint64_t total = 0, copied = 0;
  int line_no = 0;
  while (std::getline(manifest, line)) {
    ++line_no;
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    const std::string where = manifest_path + ":" + std::to_string(line_no);
    if (kind == "gguf-fill") {
      int version = 0;
      fields >> version >> total;
      if (version != 1 || total < head.size()) return Fail(where + ": unknown manifest");
      if (!WriteAt(out, head.data(), head.size(), 0) || ftruncate(out, static_cast<off_t>(total)))
        return Fail("cannot write " + out_path);
    } else if (kind == "check") {
      std::string file, want;
      uint64_t n = 0;
      fields >> file >> n >> want;
      int fd = source(file);
      if (fd < 0) return Fail(where + ": cannot open " + dir + "/" + file);
      buffer.resize(n);
      if (!ReadAt(fd, buffer.data(), n, 0)) return Fail(where + ": " + file + " is short");
      char got[17];
      std::snprintf(got, sizeof got, "%016llx", static_cast<unsigned long long>(Fnv1a64(buffer)));
      if (want != got)
        return Fail(where + ": " + file + "'s header differs from the one the manifest was " +
                    "made from (another preset or glm-run version?)");
    } else if (kind == "copy" || kind == "f32") {
      if (total == 0) return Fail(where + ": a copy before the gguf-fill line");
      std::string file;
      uint64_t dst = 0, src = 0, n = 0;
      fields >> dst >> file >> src >> n;
      const uint64_t out_bytes = kind == "f32" ? 2 * n : n;
      if (!fields || dst + out_bytes > total || dst < head.size())
        return Fail(where + ": bad record");
      int fd = source(file);
      if (fd < 0) return Fail(where + ": cannot open " + dir + "/" + file);
      for (uint64_t done = 0; done < n; done += kChunk) {
        const size_t step = static_cast<size_t>(std::min(kChunk, n - done));
        buffer.resize(step);
        if (!ReadAt(fd, buffer.data(), step, src + done))
          return Fail(where + ": " + file + " is short");
        if (kind == "copy") {
          if (!WriteAt(out, buffer.data(), step, dst + done)) return Fail("write failed");
          continue;
        }
        // bf16 -> fp32 is exact: the bf16 bits are the fp32's upper half.
        wide.resize(2 * step);
        for (size_t i = 0; i + 1 < step; i += 2) {
          uint16_t h;
          std::memcpy(&h, buffer.data() + i, 2);
          const uint32_t f = static_cast<uint32_t>(h) << 16;
          std::memcpy(wide.data() + 2 * i, &f, 4);
        }
        if (!WriteAt(out, wide.data(), wide.size(), dst + 2 * done)) return Fail("write failed");
      }
      copied += out_bytes;
    } else if (!kind.empty()) {
      return Fail(where + ": unknown record '" + kind + "'");
    }
  }
  for (auto& [name, fd] : sources)
    if (fd >= 0) close(fd);
  if (total == 0) return Fail("empty manifest");
  if (close(out) != 0) return Fail("cannot write " + out_path);
  std::printf("gguf_fill: wrote %s (%.2f GB, %.2f GB of tensor data)\n", out_path.c_str(),
              total / 1e9, copied / 1e9);
  return 0;
}
