// Fake CUDA runtime and cuBLAS for tools/cuda_emu: kernels run on the CPU, every block as
// cooperative fibers (see README.md). Verification only; never linked into the product.
//
// Threads: the ranks of a tensor-parallel group run as threads of one process, each on its
// own device, stream and kernels, so this runtime is thread-safe. What a CUDA thread owns is
// thread_local here (the current device, the last error, the running block's fibers and the
// scheduling RNG); what the process shares (allocations, streams and their capture state,
// function attributes) is behind a mutex that is never held while an operation runs: an
// operation may block (an emulated NCCL collective waits for the other ranks).
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "cublas_v2.h"
#include "emu_device.h"
#include "emu_internal.h"

__thread EmuDim threadIdx, blockIdx, blockDim, gridDim;

namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "EMU FATAL: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

thread_local cudaError_t g_last_error = cudaSuccess;  // CUDA's last error is per thread

// EMU_DEVICES devices (default 8), or none with EMU_NO_DEVICE.
int Devices() {
  static const int n = [] {
    if (std::getenv("EMU_NO_DEVICE")) return 0;
    const char* env = std::getenv("EMU_DEVICES");
    return env != nullptr ? std::max(0, std::atoi(env)) : 8;
  }();
  return n;
}
thread_local int g_device = 0;  // cudaSetDevice's, per thread as in CUDA
cudaError_t Fail(cudaError_t e) {
  g_last_error = e;
  return e;
}

// ---- memory with guard pages ----------------------------------------------------------
constexpr size_t kPage = 4096;
struct Alloc {
  char* map;
  size_t map_size;
  size_t size;
  size_t padded;
  int device;  // -1: pinned host memory
};
// Read (range checks, canary sweeps) far more often than changed: a shared mutex.
std::shared_mutex g_alloc_mu;
std::map<char*, Alloc> g_allocs;  // user start -> allocation; guarded by g_alloc_mu

size_t RoundUp(size_t v, size_t m) { return (v + m - 1) / m * m; }

void* Allocate(size_t size, int device) {
  const size_t padded = RoundUp(std::max<size_t>(size, 1), 256);
  const size_t body = RoundUp(padded, kPage);
  const size_t map_size = kPage + body + kPage;
  char* map = static_cast<char*>(
      mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (map == MAP_FAILED) return nullptr;
  mprotect(map, kPage, PROT_NONE);
  mprotect(map + kPage + body, kPage, PROT_NONE);
  char* user = map + kPage + body - padded;  // ends at the back guard page (256-aligned)
  std::memset(map + kPage, 0xa5, body);      // canary before
  std::memset(user, 0xff, size);             // uninitialised device memory reads as NaN
  std::unique_lock lock(g_alloc_mu);
  g_allocs[user] = {map, map_size, size, padded, device};
  return user;
}

void CheckCanaries() {
  std::shared_lock lock(g_alloc_mu);
  for (const auto& [user, a] : g_allocs) {
    for (size_t i = a.size; i < a.padded; ++i) {
      if (static_cast<unsigned char>(user[i]) != 0xa5) {
        std::fprintf(stderr, "EMU: write past the end of a %zu-byte allocation (byte %zu)\n",
                     a.size, i);
        Die("buffer overflow");
      }
    }
  }
}

void Release(void* p) {
  if (p == nullptr) return;
  CheckCanaries();
  Alloc a;
  {
    std::unique_lock lock(g_alloc_mu);
    auto it = g_allocs.find(static_cast<char*>(p));
    if (it == g_allocs.end()) Die("free of an unknown pointer");
    a = it->second;
    g_allocs.erase(it);
  }
  // Unmapped once out of the map, so that no other thread's canary sweep reads it.
  munmap(a.map, a.map_size);
}

// The allocation holding [p, p + n) (device or pinned), or null. Needs g_alloc_mu.
const Alloc* Holding(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  auto it = g_allocs.upper_bound(const_cast<char*>(c));
  if (it == g_allocs.begin()) return nullptr;
  --it;
  return c >= it->first && c + n <= it->first + it->second.size ? &it->second : nullptr;
}
bool Inside(const void* p, size_t n) {
  std::shared_lock lock(g_alloc_mu);
  return Holding(p, n) != nullptr;
}
void CheckDevice(const void* p, size_t n, const char* what) {
  if (n > 0 && !Inside(p, n)) {
    std::fprintf(stderr, "EMU: %s: range [%p, +%zu) is outside every allocation\n", what, p, n);
    Die("out-of-range device access");
  }
}

// ---- streams, capture, graphs ---------------------------------------------------------
// A capture belongs to its stream: whatever thread enqueues on a capturing stream records
// into it. Which synchronous calls a capture forbids depends, as in CUDA, on its mode and
// on the thread that began it: Global forbids them on every thread, ThreadLocal on that
// thread only, Relaxed on none; and the legacy stream, which synchronises with the blocking
// streams of its device, cannot be used while one of them captures.
using Op = std::function<void()>;
struct StreamState {
  int device = -1;  // -1: the legacy stream, which is every device's
  bool blocking = true;
  bool capturing = false;
  bool invalidated = false;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id capturer;
  std::vector<Op> ops;
};
std::mutex g_mu;            // guards g_streams, every stream's capture state and ops, g_func_smem
StreamState g_null_stream;  // never captures (cudaStreamBeginCapture refuses it)
std::atomic<int> g_capturing{0};  // streams capturing now: 0 skips the lock
std::vector<StreamState*> g_streams;

StreamState* S(cudaStream_t s) {
  return s == nullptr ? &g_null_stream : reinterpret_cast<StreamState*>(s);
}
// Needs g_mu. Whether a capture forbids a synchronous call (or, with `legacy`, a use of the
// legacy stream) on this thread; the captures that forbid it are invalidated, as in CUDA.
bool Forbidden(bool legacy) {
  const std::thread::id me = std::this_thread::get_id();
  bool forbidden = false;
  for (StreamState* s : g_streams) {
    if (!s->capturing) continue;
    const bool mine = s->capturer == me;
    if ((mine && s->mode != cudaStreamCaptureModeRelaxed) ||
        (!mine && s->mode == cudaStreamCaptureModeGlobal) ||
        (legacy && s->blocking && s->device == g_device)) {
      s->invalidated = true;
      forbidden = true;
    }
  }
  return forbidden;
}
cudaError_t Unsafe(bool legacy = false) {  // a synchronous call while some stream captures
  if (g_capturing.load() == 0) return cudaSuccess;
  {
    std::lock_guard lock(g_mu);
    if (!Forbidden(legacy)) return cudaSuccess;
  }
  std::fprintf(stderr, "EMU: %s during stream capture\n",
               legacy ? "use of the legacy stream" : "synchronous CUDA call");
  return Fail(cudaErrorStreamCaptureUnsupported);
}
// Runs `op` at once on this thread (no lock held: it may block), or records it into a
// capturing stream.
cudaError_t Enqueue(cudaStream_t stream, Op op) {
  if (g_capturing.load() > 0) {
    if (stream == nullptr) {
      if (cudaError_t e = Unsafe(/*legacy=*/true); e != cudaSuccess) return e;
    } else {
      StreamState* s = S(stream);
      std::lock_guard lock(g_mu);
      if (s->capturing) {
        s->ops.push_back(std::move(op));
        return cudaSuccess;
      }
    }
  }
  op();
  return cudaSuccess;
}

// ---- fibers ---------------------------------------------------------------------------
extern "C" void emu_switch(void** save_sp, void* new_sp);
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size emu_switch, .-emu_switch
)");

constexpr size_t kStack = 128 * 1024;
struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr;
  unsigned tid = 0;
  bool done = false;
  int wait = 0;  // 1: block barrier, 2: warp barrier
};
struct Block {
  std::vector<Fiber> fibers;
  void* sched_sp = nullptr;
  int current = 0;
  const std::function<void()>* body = nullptr;
  int alive = 0;
  int block_arrived = 0;
  std::vector<int> warp_arrived, warp_alive;
  std::vector<float> shfl;
  std::vector<char> dyn_smem;
};
// The block a thread runs, its fiber stacks and its scheduling order: per thread, since
// every thread (rank) runs its own kernels.
thread_local Block g_block;
struct StackPool {
  std::vector<char*> stacks;
  ~StackPool() {
    for (char* s : stacks) std::free(s);
  }
};
thread_local StackPool g_stack_pool;
thread_local std::mt19937 g_rng(std::getenv("EMU_SEED") ? std::atoi(std::getenv("EMU_SEED"))
                                                        : 12345);

void FiberEntry() {
  (*g_block.body)();
  Fiber& f = g_block.fibers[g_block.current];
  f.done = true;
  emu_switch(&f.sp, g_block.sched_sp);
  Die("finished fiber resumed");
}

void Yield() {
  Fiber& f = g_block.fibers[g_block.current];
  emu_switch(&f.sp, g_block.sched_sp);
}

void CheckRelease() {
  Block& b = g_block;
  if (b.block_arrived > 0 && b.block_arrived == b.alive) {
    for (Fiber& f : b.fibers) {
      if (f.wait == 1) f.wait = 0;
    }
    b.block_arrived = 0;
  }
  for (size_t w = 0; w < b.warp_arrived.size(); ++w) {
    if (b.warp_arrived[w] > 0 && b.warp_arrived[w] == b.warp_alive[w]) {
      for (size_t i = w * 32; i < std::min(b.fibers.size(), (w + 1) * 32); ++i) {
        if (b.fibers[i].wait == 2) b.fibers[i].wait = 0;
      }
      b.warp_arrived[w] = 0;
    }
  }
}

void RunBlock(unsigned threads, size_t smem, const std::function<void()>& body) {
  Block& b = g_block;
  b.fibers.assign(threads, Fiber{});
  b.body = &body;
  b.alive = static_cast<int>(threads);
  b.block_arrived = 0;
  const size_t warps = (threads + 31) / 32;
  b.warp_arrived.assign(warps, 0);
  b.warp_alive.assign(warps, 0);
  b.shfl.assign(warps * 32, 0.f);
  b.dyn_smem.assign(smem, static_cast<char>(0xff));  // uninitialised shared memory: NaN
  while (g_stack_pool.stacks.size() < threads) {
    g_stack_pool.stacks.push_back(static_cast<char*>(std::aligned_alloc(64, kStack)));
  }
  for (unsigned i = 0; i < threads; ++i) {
    Fiber& f = b.fibers[i];
    f.tid = i;
    f.stack = g_stack_pool.stacks[i];
    char* top = f.stack + kStack;
    void** sp = reinterpret_cast<void**>(reinterpret_cast<uintptr_t>(top) / 16 * 16 - 64);
    for (int r = 0; r < 6; ++r) sp[r] = nullptr;
    sp[6] = reinterpret_cast<void*>(&FiberEntry);
    sp[7] = nullptr;
    f.sp = sp;
    ++b.warp_alive[i / 32];
  }
  std::vector<int> order(threads);
  for (unsigned i = 0; i < threads; ++i) order[i] = static_cast<int>(i);
  while (b.alive > 0) {
    bool ran = false;
    std::shuffle(order.begin(), order.end(), g_rng);
    for (int idx : order) {
      Fiber& f = b.fibers[idx];
      if (f.done || f.wait != 0) continue;
      b.current = idx;
      threadIdx = {f.tid, 0, 0};
      emu_switch(&b.sched_sp, f.sp);
      ran = true;
      if (f.done) {
        --b.alive;
        --b.warp_alive[idx / 32];
      }
      CheckRelease();
    }
    if (!ran && b.alive > 0) Die("deadlock: every live thread waits at a barrier none can pass");
  }
}

std::map<const void*, int> g_func_smem;  // guarded by g_mu

}  // namespace

// ---- device-side primitives ------------------------------------------------------------
void __syncthreads() {
  Fiber& f = g_block.fibers[g_block.current];
  f.wait = 1;
  ++g_block.block_arrived;
  Yield();
}

void __syncwarp(unsigned) {
  Fiber& f = g_block.fibers[g_block.current];
  f.wait = 2;
  ++g_block.warp_arrived[g_block.current / 32];
  Yield();
}

float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  const int idx = g_block.current;
  const int w = idx / 32, lane = idx % 32, partner = lane ^ lane_mask;
  g_block.shfl[w * 32 + lane] = v;
  __syncwarp();
  const size_t p = static_cast<size_t>(w * 32 + partner);
  if (p >= g_block.fibers.size() || g_block.fibers[p].done) Die("shuffle with an exited lane");
  const float r = g_block.shfl[p];
  __syncwarp();
  return r;
}

namespace emu {

void* DynamicSmemRaw() { return g_block.dyn_smem.data(); }

cudaError_t EnqueueHostOp(cudaStream_t stream, std::function<void()> op) {
  return Enqueue(stream, std::move(op));
}
void CheckDeviceRange(const void* p, size_t n, const char* what) { CheckDevice(p, n, what); }

void SetFuncMaxSmem(const void* func, int bytes) {
  std::lock_guard lock(g_mu);
  g_func_smem[func] = bytes;
}

int DeviceCount() { return Devices(); }
int AllocationDevice(const void* p, size_t n) {
  std::shared_lock lock(g_alloc_mu);
  const Alloc* a = Holding(p, n);
  return a != nullptr ? a->device : -2;
}
int StreamDevice(cudaStream_t s) { return s == nullptr ? g_device : S(s)->device; }

void RunKernel(const void* func, const LaunchConfig& cfg, std::function<void()> body) {
  if (cfg.block.x == 0 || cfg.block.x > 1024 || cfg.block.y != 1 || cfg.block.z != 1 ||
      cfg.grid.x == 0 || cfg.grid.y == 0 || cfg.grid.z == 0 || cfg.grid.y > 65535 ||
      cfg.grid.z > 65535) {
    std::fprintf(stderr, "EMU: bad launch config grid %u,%u,%u block %u,%u,%u\n", cfg.grid.x,
                 cfg.grid.y, cfg.grid.z, cfg.block.x, cfg.block.y, cfg.block.z);
    Fail(cudaErrorInvalidConfiguration);
    return;
  }
  if (cfg.stream != nullptr && S(cfg.stream)->device != g_device) {
    // CUDA: a stream belongs to the device it was created on; launching into it from another
    // device is an invalid handle (a rank thread that did not call cudaSetDevice).
    std::fprintf(stderr, "EMU: kernel launched on device %d into a stream of device %d\n", g_device,
                 S(cfg.stream)->device);
    Fail(cudaErrorInvalidResourceHandle);
    return;
  }
  size_t limit = 48 * 1024;
  {
    std::lock_guard lock(g_mu);
    if (auto it = g_func_smem.find(func); it != g_func_smem.end()) {
      limit = std::max<size_t>(limit, it->second);
    }
  }
  if (cfg.smem > limit) {
    std::fprintf(stderr, "EMU: %zu bytes of dynamic shared memory, limit %zu\n", cfg.smem, limit);
    Fail(cudaErrorInvalidValue);
    return;
  }
  const LaunchConfig c = cfg;
  Enqueue(cfg.stream, [c, body]() {
    for (unsigned z = 0; z < c.grid.z; ++z) {
      for (unsigned y = 0; y < c.grid.y; ++y) {
        for (unsigned x = 0; x < c.grid.x; ++x) {
          blockIdx = {x, y, z};
          blockDim = {c.block.x, 1, 1};
          gridDim = {c.grid.x, c.grid.y, c.grid.z};
          RunBlock(c.block.x, c.smem, body);
        }
      }
    }
    CheckCanaries();
  });
}

}  // namespace emu

// ---- runtime API -----------------------------------------------------------------------
cudaError_t cudaGetLastError() {
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return g_last_error; }
const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "emulated error";
}
const char* cudaGetErrorName(cudaError_t e) {
  thread_local char buf[64];
  std::snprintf(buf, sizeof buf, "cudaError(%d)", static_cast<int>(e));
  return buf;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = Devices();
  return cudaSuccess;
}
namespace {
bool ValidDevice(int d) { return d >= 0 && d < Devices(); }
}  // namespace
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (!ValidDevice(d)) return Fail(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::strcpy(p->name, "Emulated GPU");
  p->totalGlobalMem = size_t{80} << 30;
  p->multiProcessorCount = 132;
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (!ValidDevice(d)) {
    std::fprintf(stderr, "EMU: cudaSetDevice(%d) with %d devices\n", d, Devices());
    return Fail(cudaErrorInvalidDevice);
  }
  g_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = g_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int d) {
  if (!ValidDevice(d)) return Fail(cudaErrorInvalidDevice);
  *v = 227 * 1024;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  if (cudaError_t e = Unsafe(); e != cudaSuccess) return e;
  CheckCanaries();
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t n) {
  if (cudaError_t e = Unsafe(); e != cudaSuccess) return e;
  *p = Allocate(n, g_device);
  return *p ? cudaSuccess : Fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
  Release(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t n) {
  if (cudaError_t e = Unsafe(); e != cudaSuccess) return e;
  *p = Allocate(n, -1);
  return *p ? cudaSuccess : Fail(cudaErrorMemoryAllocation);
}

// The emulated device claims 16 GiB, all free: enough for the memory planner's arithmetic.
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = size_t{16} << 30;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }

namespace {
void CheckCopy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice)
    CheckDevice(dst, n, "copy dst");
  if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice)
    CheckDevice(src, n, "copy src");
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (cudaError_t e = Unsafe(); e != cudaSuccess) return e;
  CheckCopy(dst, src, n, kind);
  std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s) {
  CheckCopy(dst, src, n, kind);
  return Enqueue(s, [=] { std::memmove(dst, src, n); });
}
cudaError_t cudaMemset(void* p, int v, size_t n) {
  if (cudaError_t e = Unsafe(); e != cudaSuccess) return e;
  CheckDevice(p, n, "memset");
  std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
  CheckDevice(p, n, "memset");
  return Enqueue(s, [=] { std::memset(p, v, n); });
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  auto* st = new StreamState;
  st->device = g_device;
  st->blocking = (flags & cudaStreamNonBlocking) == 0;
  std::lock_guard lock(g_mu);
  g_streams.push_back(st);
  *s = reinterpret_cast<cudaStream_t>(st);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  auto* st = S(s);
  std::lock_guard lock(g_mu);
  g_streams.erase(std::find(g_streams.begin(), g_streams.end(), st));
  if (st->capturing) --g_capturing;
  delete st;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  bool capturing = false;
  {
    std::lock_guard lock(g_mu);
    capturing = S(s)->capturing;
    if (capturing) S(s)->invalidated = true;
  }
  if (capturing) {
    std::fprintf(stderr, "EMU: cudaStreamSynchronize on a capturing stream\n");
    return Fail(cudaErrorStreamCaptureUnsupported);
  }
  CheckCanaries();
  return cudaSuccess;
}
struct EmuEvent {
  int unused;
};
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = reinterpret_cast<cudaEvent_t>(new EmuEvent);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<EmuEvent*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t s) {
  return Enqueue(s, [] {});
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return Unsafe(); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 1.f;
  return cudaSuccess;
}
// A graph's operations are immutable once captured and shared by its instantiations and by
// the launches still recorded in other captures.
using Ops = std::shared_ptr<const std::vector<Op>>;
struct EmuGraph {
  Ops ops;
};
struct EmuGraphExec {
  Ops ops;
};
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  StreamState* st = S(s);
  std::lock_guard lock(g_mu);
  if (s == nullptr || st->capturing) return Fail(cudaErrorInvalidValue);
  st->capturing = true;
  st->invalidated = false;
  st->mode = mode;
  st->capturer = std::this_thread::get_id();
  st->ops.clear();
  ++g_capturing;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  StreamState* st = S(s);
  std::vector<Op> ops;
  bool invalidated = false;
  {
    std::lock_guard lock(g_mu);
    if (!st->capturing) return Fail(cudaErrorInvalidValue);
    if (st->mode != cudaStreamCaptureModeRelaxed && st->capturer != std::this_thread::get_id()) {
      return Fail(cudaErrorStreamCaptureWrongThread);
    }
    st->capturing = false;
    --g_capturing;
    invalidated = st->invalidated;
    ops.swap(st->ops);
  }
  if (invalidated) {
    *g = nullptr;
    return Fail(cudaErrorStreamCaptureInvalidated);
  }
  *g = reinterpret_cast<cudaGraph_t>(
      new EmuGraph{std::make_shared<const std::vector<Op>>(std::move(ops))});
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long) {
  *e = reinterpret_cast<cudaGraphExec_t>(new EmuGraphExec{reinterpret_cast<EmuGraph*>(g)->ops});
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  Ops ops = reinterpret_cast<EmuGraphExec*>(e)->ops;
  return Enqueue(s, [ops = std::move(ops)] {
    for (const Op& op : *ops) op();
  });
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete reinterpret_cast<EmuGraph*>(g);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  delete reinterpret_cast<EmuGraphExec*>(e);
  return cudaSuccess;
}

// ---- cuBLAS ----------------------------------------------------------------------------
struct EmuCublas {
  cudaStream_t stream = nullptr;
};
cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(new EmuCublas);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete reinterpret_cast<EmuCublas*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  reinterpret_cast<EmuCublas*>(h)->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void* p, size_t n) {
  CheckDevice(p, n, "cublas workspace");
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS_EMU"; }
const char* cublasGetStatusString(cublasStatus_t) { return "emulated cublas error"; }

namespace {
float Load(const void* p, cudaDataType t, size_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
void Store(void* p, cudaDataType t, size_t i, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(p)[i] = v;
    return;
  }
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(bits >> 16);
}
size_t Span(int rows, int cols, int ld, size_t elem) {
  return (static_cast<size_t>(cols - 1) * ld + rows) * elem;
}
}  // namespace

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void* alpha, const void* A, cudaDataType at,
                            int lda, const void* B, cudaDataType bt, int ldb, const void* beta,
                            void* C, cudaDataType ct, int ldc, cublasComputeType_t,
                            cublasGemmAlgo_t) {
  if (m <= 0 || n <= 0 || k <= 0) return CUBLAS_STATUS_INVALID_VALUE;
  const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  if (lda < a_rows || ldb < b_rows || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
  const size_t ae = at == CUDA_R_32F ? 4 : 2, be = bt == CUDA_R_32F ? 4 : 2,
               ce = ct == CUDA_R_32F ? 4 : 2;
  CheckDevice(A, Span(a_rows, a_cols, lda, ae), "gemm A");
  CheckDevice(B, Span(b_rows, b_cols, ldb, be), "gemm B");
  CheckDevice(C, Span(m, n, ldc, ce), "gemm C");
  const float al = *static_cast<const float*>(alpha), bet = *static_cast<const float*>(beta);
  const cudaError_t e = Enqueue(reinterpret_cast<EmuCublas*>(h)->stream, [=] {
    std::vector<float> arow(k);
    for (int i = 0; i < m; ++i) {
      for (int l = 0; l < k; ++l) {
        arow[l] = Load(A, at,
                       ta == CUBLAS_OP_N ? static_cast<size_t>(l) * lda + i
                                         : static_cast<size_t>(i) * lda + l);
      }
      for (int j = 0; j < n; ++j) {
        double sum = 0;
        for (int l = 0; l < k; ++l) {
          sum += static_cast<double>(arow[l]) * Load(B, bt,
                                                     tb == CUBLAS_OP_N
                                                         ? static_cast<size_t>(j) * ldb + l
                                                         : static_cast<size_t>(l) * ldb + j);
        }
        const size_t ci = static_cast<size_t>(j) * ldc + i;
        const float old = bet != 0.f ? Load(C, ct, ci) : 0.f;
        Store(C, ct, ci, static_cast<float>(al * sum + bet * old));
      }
    }
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
