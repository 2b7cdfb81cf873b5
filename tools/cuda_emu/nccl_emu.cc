// In-process NCCL for tools/cuda_emu (fake/nccl.h, README.md): the ranks of a group are
// threads of this process, each on its own emulated device, so core/cuda/nccl_communicator.cc
// runs unchanged. Verification only; never linked into the product.
//
// Every operation is a host operation on its stream (emu::EnqueueHostOp): it runs at once,
// or is recorded by a capturing stream and runs when the graph is launched, as NCCL's kernels
// are captured. Running, it meets the other ranks' matching call, copies what this rank
// receives straight from their device buffers (one address space), and meets them again, so
// that no rank returns (and overwrites a buffer) while another still reads it.
//
// What it checks, each a failure with its reason on stderr instead of wrong data or a hang:
// every rank makes the same collectives in the same order with the same count, type and root
// (a rank that diverged, e.g. took another branch of the model); the k-th send from a to b
// has the count and type of the k-th receive on b from a; buffers are device allocations of
// the communicator's device large enough for the call, and the stream is that device's. A
// rank that waits longer than EMU_NCCL_TIMEOUT_S (default 60) for the others gives up, naming
// whom it waited for. Any failure, and ncclCommAbort from any thread, poisons the group:
// waiting ranks wake, and every pending and later operation of every rank fails (the error is
// also the communicators' asynchronous error).
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "emu_internal.h"

namespace {

using Clock = std::chrono::steady_clock;

double TimeoutSeconds() {
  static const double seconds = [] {
    const char* env = std::getenv("EMU_NCCL_TIMEOUT_S");
    const double v = env != nullptr ? std::atof(env) : 0.0;
    return v > 0 ? v : 60.0;
  }();
  return seconds;
}
Clock::time_point Deadline() {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(TimeoutSeconds()));
}

size_t TypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

std::string Str(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Str(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

enum class Kind { kAllGather, kBroadcast, kSend, kRecv };

// One call of one rank, as made.
struct Item {
  Kind kind;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  int peer = 0;  // a broadcast's root; the other rank of a send or receive
};

std::string Describe(const Item& it) {
  switch (it.kind) {
    case Kind::kAllGather:
      return Str("ncclAllGather(count %zu, type %d)", it.count, static_cast<int>(it.type));
    case Kind::kBroadcast:
      return Str("ncclBroadcast(count %zu, type %d, root %d)", it.count, static_cast<int>(it.type),
                 it.peer);
    case Kind::kSend:
      return Str("ncclSend(count %zu, type %d, to %d)", it.count, static_cast<int>(it.type),
                 it.peer);
    case Kind::kRecv:
      return Str("ncclRecv(count %zu, type %d, from %d)", it.count, static_cast<int>(it.type),
                 it.peer);
  }
  return "?";
}
std::string Describe(const std::vector<Item>& items) {
  if (items.size() == 1) return Describe(items[0]);
  std::string s = "a group call of";
  for (const Item& it : items) s += " " + Describe(it);
  return s;
}

// A send waiting for its receive. The receiver marks it taken while it copies from buf, so
// the sender does not return (and let buf change) until it is done.
struct SendSlot {
  const void* buf;
  size_t count;
  ncclDataType_t type;
  bool taken = false;
  bool done = false;
};

struct Group {
  explicit Group(int n) : size(n), arrived(n, false), posted(n, nullptr), destroyed(n, false) {}
  const int size;
  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  // Permanent once set: the first failure (or abort), which every later operation reports.
  std::string broken;
  ncclResult_t broken_code = ncclSuccess;
  // The collective meeting: each rank posts its collective calls and waits for the others.
  uint64_t generation = 0;
  int arrivals = 0;
  std::vector<bool> arrived;
  std::vector<const std::vector<Item>*> posted;  // valid until the second meeting
  // The second meeting: ranks still copying from the others' buffers.
  int copying = 0;
  uint64_t copy_generation = 0;
  // Sends from a to b, in order, in channels[a * size + b] (std::map: references stay valid).
  std::map<int, std::deque<std::shared_ptr<SendSlot>>> channels;
  std::vector<bool> destroyed;  // a rank that destroyed its communicator never comes again
};

// Needs g.mu. The first failure poisons the group and wakes every waiting rank.
void Break(Group& g, ncclResult_t code, const std::string& why) {
  if (!g.broken.empty()) return;
  g.broken = why;
  g.broken_code = code;
  // Sends nobody took fail (their senders return); taken ones finish their copy first.
  for (auto& [key, queue] : g.channels) queue.clear();
  g.cv.notify_all();
}

}  // namespace

struct EmuNcclComm {
  std::shared_ptr<Group> group;
  int rank = 0;
  int device = 0;
  std::atomic<ncclResult_t> async{ncclSuccess};
  // Destroyed or aborted: operations recorded in a graph before then fail when replayed.
  std::atomic<bool> gone{false};
};

namespace {

using CommPtr = std::shared_ptr<EmuNcclComm>;

std::mutex g_mu;  // guards g_comms and g_pending
// The live communicators: a handle not here was destroyed or aborted (or never made). The
// operations recorded in graphs hold their own reference, so a replay after destruction is
// reported instead of reading freed memory.
std::map<EmuNcclComm*, CommPtr> g_comms;
// ncclCommInitRank's groups still being joined, by unique id.
struct Joining {
  int nranks = 0;
  std::shared_ptr<Group> group;
  std::vector<CommPtr> comms;
  int joined = 0;
  bool complete = false;
  std::string failed;
};
std::map<std::string, std::shared_ptr<Joining>> g_joining;
std::condition_variable g_join_cv;
std::atomic<uint64_t> g_next_id{1};

CommPtr Find(ncclComm_t comm, const char* fn) {
  std::lock_guard lock(g_mu);
  auto it = g_comms.find(comm);
  if (it != g_comms.end()) return it->second;
  std::fprintf(stderr, "EMU NCCL: %s: %p is not a live communicator (destroyed or aborted?)\n", fn,
               static_cast<void*>(comm));
  return nullptr;
}

ncclResult_t SetAsync(EmuNcclComm& c, ncclResult_t r) {
  ncclResult_t expected = ncclSuccess;
  c.async.compare_exchange_strong(expected, r);
  return r;
}

// Needs g.mu (in lk). Waits until ready() or the group breaks; a rank that `gone()` names
// (destroyed, so never coming) or the timeout breaks it. True when ready.
bool Wait(Group& g, std::unique_lock<std::mutex>& lk, const std::function<bool()>& ready,
          const std::function<std::string()>& gone, const std::function<std::string()>& what) {
  const Clock::time_point deadline = Deadline();
  while (!ready()) {
    if (!g.broken.empty()) return false;
    if (std::string who = gone(); !who.empty()) {
      Break(g, ncclRemoteError, what() + ": " + who + " destroyed its communicator");
      return false;
    }
    if (g.cv.wait_until(lk, deadline) == std::cv_status::timeout && !ready() && g.broken.empty()) {
      Break(g, ncclRemoteError,
            what() + Str(": timed out after %g s (EMU_NCCL_TIMEOUT_S)", TimeoutSeconds()));
      return false;
    }
  }
  return true;
}

// The collective calls of a batch: every rank posts them, the first meeting checks they are
// the same on every rank, each copies what it receives, and the second meeting holds every
// rank until all have copied.
ncclResult_t Collective(EmuNcclComm& c, const std::vector<Item>& mine) {
  Group& g = *c.group;
  std::unique_lock lk(g.mu);
  if (!g.broken.empty()) return g.broken_code;
  const uint64_t generation = g.generation;
  g.posted[c.rank] = &mine;
  g.arrived[c.rank] = true;
  if (++g.arrivals == g.size) {
    g.arrivals = 0;
    std::fill(g.arrived.begin(), g.arrived.end(), false);
    ++g.generation;
    g.copying = g.size;
    g.cv.notify_all();
  } else {
    auto missing = [&](bool only_destroyed) {
      std::string who;
      for (int q = 0; q < g.size; ++q) {
        if (!g.arrived[q] && (!only_destroyed || g.destroyed[q])) {
          who += (who.empty() ? "rank " : ", ") + std::to_string(q);
        }
      }
      return who;
    };
    if (!Wait(
            g, lk, [&] { return g.generation != generation; }, [&] { return missing(true); },
            [&] {
              return Str("rank %d waits at %s for ", c.rank, Describe(mine).c_str()) +
                     missing(false);
            })) {
      return g.broken_code;
    }
  }
  lk.unlock();
  // Every rank's calls stay posted until the second meeting: compare, then copy.
  std::string mismatch;
  for (int q = 0; q < g.size && mismatch.empty(); ++q) {
    const std::vector<Item>& theirs = *g.posted[q];
    bool same = theirs.size() == mine.size();
    for (size_t i = 0; same && i < mine.size(); ++i) {
      same = theirs[i].kind == mine[i].kind && theirs[i].count == mine[i].count &&
             theirs[i].type == mine[i].type &&
             (mine[i].kind != Kind::kBroadcast || theirs[i].peer == mine[i].peer);
    }
    if (!same) {
      mismatch = Str("ranks disagree on a collective: rank %d calls %s, rank %d calls %s", c.rank,
                     Describe(mine).c_str(), q, Describe(theirs).c_str());
    }
  }
  if (mismatch.empty()) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const Item& it = mine[i];
      const size_t bytes = it.count * TypeBytes(it.type);
      if (bytes == 0) continue;
      if (it.kind == Kind::kAllGather) {
        for (int q = 0; q < g.size; ++q) {
          const void* src = (*g.posted[q])[i].send;
          void* dst = static_cast<char*>(it.recv) + q * bytes;
          if (src != dst) std::memmove(dst, src, bytes);
        }
      } else {
        const void* src = (*g.posted[it.peer])[i].send;
        if (src != it.recv) std::memmove(it.recv, src, bytes);
      }
    }
  }
  lk.lock();
  if (!mismatch.empty()) Break(g, ncclInvalidUsage, mismatch);
  // Not abortable and without a timeout: between the meetings nobody waits for anything.
  const uint64_t copy_generation = g.copy_generation;
  if (--g.copying == 0) {
    ++g.copy_generation;
    g.cv.notify_all();
  } else {
    g.cv.wait(lk, [&] { return g.copy_generation != copy_generation; });
  }
  return mismatch.empty() ? ncclSuccess : ncclInvalidUsage;
}

ncclResult_t Receive(EmuNcclComm& c, const Item& it) {
  Group& g = *c.group;
  std::unique_lock lk(g.mu);
  std::deque<std::shared_ptr<SendSlot>>& channel = g.channels[it.peer * g.size + c.rank];
  if (!Wait(
          g, lk, [&] { return !channel.empty(); },
          [&] { return g.destroyed[it.peer] ? Str("rank %d", it.peer) : std::string(); },
          [&] {
            return Str("rank %d waits at %s for rank %d's send", c.rank, Describe(it).c_str(),
                       it.peer);
          })) {
    return g.broken_code;
  }
  std::shared_ptr<SendSlot> slot = channel.front();
  channel.pop_front();
  if (slot->count != it.count || slot->type != it.type) {
    Break(g, ncclInvalidUsage,
          Str("rank %d sends %zu elements of type %d to rank %d, which receives %s", it.peer,
              slot->count, static_cast<int>(slot->type), c.rank, Describe(it).c_str()));
    return ncclInvalidUsage;
  }
  slot->taken = true;
  lk.unlock();
  std::memmove(it.recv, slot->buf, it.count * TypeBytes(it.type));
  lk.lock();
  slot->done = true;
  g.cv.notify_all();
  return ncclSuccess;
}

// Runs one rank's batch (one call, or a group call's calls on this communicator): sends are
// posted first, so that no order of the calls inside a group can deadlock.
ncclResult_t RunBatch(const CommPtr& comm, const std::vector<Item>& items) {
  EmuNcclComm& c = *comm;
  Group& g = *c.group;
  ncclResult_t result = ncclSuccess;
  std::vector<Item> collectives, receives;
  std::vector<std::pair<int, std::shared_ptr<SendSlot>>> sends;
  for (const Item& it : items) {
    if (it.kind == Kind::kSend) {
      sends.emplace_back(it.peer, std::make_shared<SendSlot>(SendSlot{it.send, it.count, it.type}));
    } else if (it.kind == Kind::kRecv) {
      receives.push_back(it);
    } else {
      collectives.push_back(it);
    }
  }
  {
    std::lock_guard lock(g.mu);
    if (c.gone) {
      Break(g, ncclInvalidUsage,
            Str("rank %d's communicator was destroyed, then its %s ran (a graph replayed?)", c.rank,
                Describe(items).c_str()));
    }
    if (!g.broken.empty()) {
      result = g.broken_code;
    } else {
      for (auto& [peer, slot] : sends) g.channels[c.rank * g.size + peer].push_back(slot);
      if (!sends.empty()) g.cv.notify_all();
    }
  }
  if (result == ncclSuccess && !collectives.empty()) result = Collective(c, collectives);
  for (size_t i = 0; result == ncclSuccess && i < receives.size(); ++i) {
    result = Receive(c, receives[i]);
  }
  {
    std::unique_lock lk(g.mu);
    for (auto& [peer, slot] : sends) {
      const int to = peer;
      SendSlot& s = *slot;
      // A taken send is waited for even when the group broke: the receiver is copying.
      auto settled = [&] { return s.done || (!g.broken.empty() && !s.taken); };
      if (!settled() &&
          !Wait(
              g, lk, settled,
              [&] { return g.destroyed[to] && !s.taken ? Str("rank %d", to) : std::string(); },
              [&] {
                return Str("rank %d waits for rank %d to receive its ncclSend(count %zu)", c.rank,
                           to, s.count);
              })) {
        g.cv.wait(lk, [&] { return s.done || !s.taken; });
      }
      if (!s.done && result == ncclSuccess) result = g.broken_code;
    }
    if (result != ncclSuccess && g.broken.empty()) Break(g, result, "an operation failed");
    if (result != ncclSuccess) {
      std::fprintf(stderr, "EMU NCCL: rank %d (device %d): %s failed: %s\n", c.rank, c.device,
                   Describe(items).c_str(), g.broken.c_str());
    }
  }
  return result == ncclSuccess ? ncclSuccess : SetAsync(c, result);
}

// Enqueues a batch on `stream`. Run at once (the stream is not capturing), its result is the
// call's; recorded, the call succeeds and a failure at replay is the asynchronous error.
ncclResult_t Submit(const CommPtr& comm, cudaStream_t stream, std::vector<Item> items) {
  auto ran = std::make_shared<std::atomic<int>>(-1);
  const cudaError_t e = emu::EnqueueHostOp(
      stream, [comm, items = std::move(items), ran] { ran->store(RunBatch(comm, items)); });
  if (e != cudaSuccess) {
    std::fprintf(stderr, "EMU NCCL: rank %d: enqueueing on its stream failed (cudaError %d)\n",
                 comm->rank, static_cast<int>(e));
    return ncclUnhandledCudaError;
  }
  const int r = ran->load();
  return r < 0 ? ncclSuccess : static_cast<ncclResult_t>(r);
}

// The calls of an open group call on this thread (ncclGroupStart nests).
struct PendingCall {
  CommPtr comm;
  cudaStream_t stream;
  Item item;
};
thread_local int t_group_depth = 0;
thread_local std::vector<PendingCall> t_group;
thread_local ncclResult_t t_group_error = ncclSuccess;

// "" when the buffer suits the communicator; else why not.
std::string CheckBuffer(const EmuNcclComm& c, const void* p, size_t bytes, const char* what) {
  if (bytes == 0) return "";
  const int d = emu::AllocationDevice(p, bytes);
  if (d == c.device) return "";
  std::string where = d == -2   ? std::string("outside every allocation")
                      : d == -1 ? std::string("pinned host memory, not device memory")
                                : Str("on device %d", d);
  return Str("%s [%p, +%zu bytes) is %s; the communicator's device is %d", what, p, bytes,
             where.c_str(), c.device);
}

std::string Check(const EmuNcclComm& c, const Item& it, cudaStream_t stream) {
  const size_t elem = TypeBytes(it.type);
  if (elem == 0) return Str("unknown data type %d", static_cast<int>(it.type));
  if (emu::StreamDevice(stream) != c.device) {
    return Str("its stream is device %d's; the communicator's device is %d",
               emu::StreamDevice(stream), c.device);
  }
  const int size = c.group->size;
  if (it.kind != Kind::kAllGather && (it.peer < 0 || it.peer >= size)) {
    return Str("rank %d is not in a group of %d", it.peer, size);
  }
  const size_t bytes = it.count * elem;
  switch (it.kind) {
    case Kind::kAllGather: {
      std::string why = CheckBuffer(c, it.send, bytes, "sendbuff");
      return why.empty() ? CheckBuffer(c, it.recv, bytes * size, "recvbuff") : why;
    }
    case Kind::kBroadcast: {
      std::string why = it.peer == c.rank ? CheckBuffer(c, it.send, bytes, "sendbuff") : "";
      return why.empty() ? CheckBuffer(c, it.recv, bytes, "recvbuff") : why;
    }
    case Kind::kSend:
      return CheckBuffer(c, it.send, bytes, "sendbuff");
    case Kind::kRecv:
      return CheckBuffer(c, it.recv, bytes, "recvbuff");
  }
  return "";
}

// A call: checked now; run (or recorded) now, or kept for the group call's end.
ncclResult_t Call(ncclComm_t handle, cudaStream_t stream, const Item& it, const char* fn) {
  CommPtr comm = Find(handle, fn);
  ncclResult_t result = ncclSuccess;
  if (comm == nullptr) {
    result = ncclInvalidArgument;
  } else if (std::string why = Check(*comm, it, stream); !why.empty()) {
    std::fprintf(stderr, "EMU NCCL: rank %d (device %d): %s: %s\n", comm->rank, comm->device,
                 Describe(it).c_str(), why.c_str());
    // The others would wait for this rank's call: they fail with the reason instead.
    std::lock_guard lock(comm->group->mu);
    Break(*comm->group, ncclInvalidArgument,
          Str("rank %d made an invalid call: %s", comm->rank, why.c_str()));
    result = SetAsync(*comm, ncclInvalidArgument);
  }
  if (t_group_depth > 0) {
    if (result != ncclSuccess) {
      if (t_group_error == ncclSuccess) t_group_error = result;
    } else {
      t_group.push_back({comm, stream, it});
    }
    return result;
  }
  return result != ncclSuccess ? result : Submit(comm, stream, {it});
}

// ncclCommDestroy and ncclCommAbort: the handle is freed (in-flight operations keep the
// object). A destroyed rank never comes again, so ranks waiting for it fail; an abort fails
// the whole group at once.
ncclResult_t Release(ncclComm_t handle, bool abort, const char* fn) {
  CommPtr comm;
  {
    std::lock_guard lock(g_mu);
    auto it = g_comms.find(handle);
    if (it == g_comms.end()) {
      std::fprintf(stderr, "EMU NCCL: %s: %p is not a live communicator (destroyed twice?)\n", fn,
                   static_cast<void*>(handle));
      return ncclInvalidArgument;
    }
    comm = it->second;
    g_comms.erase(it);
  }
  comm->gone = true;
  Group& g = *comm->group;
  std::lock_guard lock(g.mu);
  g.destroyed[comm->rank] = true;
  if (abort) Break(g, ncclRemoteError, Str("rank %d's communicator was aborted", comm->rank));
  g.cv.notify_all();
  return ncclSuccess;
}

}  // namespace

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "emu-nccl-%llu",
                static_cast<unsigned long long>(g_next_id++));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (out == nullptr || nranks < 1 || rank < 0 || rank >= nranks) {
    std::fprintf(stderr, "EMU NCCL: ncclCommInitRank: rank %d of %d\n", rank, nranks);
    return ncclInvalidArgument;
  }
  int device = 0;
  cudaGetDevice(&device);
  const std::string key(id.internal, sizeof id.internal);
  std::unique_lock lk(g_mu);
  std::shared_ptr<Joining>& slot = g_joining[key];
  if (slot == nullptr) {
    slot = std::make_shared<Joining>();
    slot->nranks = nranks;
    slot->group = std::make_shared<Group>(nranks);
    slot->comms.resize(nranks);
  }
  std::shared_ptr<Joining> joining = slot;
  std::string why;
  if (joining->nranks != nranks) {
    why = Str("rank %d joins with %d ranks a group of %d", rank, nranks, joining->nranks);
  } else if (joining->comms[rank] != nullptr) {
    why = Str("rank %d joined twice", rank);
  } else {
    for (const CommPtr& c : joining->comms) {
      if (c != nullptr && c->device == device) {
        why = Str("ranks %d and %d are both on device %d", c->rank, rank, device);
      }
    }
  }
  if (!why.empty()) {
    std::fprintf(stderr, "EMU NCCL: ncclCommInitRank: %s\n", why.c_str());
    return ncclInvalidUsage;
  }
  auto comm = std::make_shared<EmuNcclComm>();
  comm->group = joining->group;
  comm->rank = rank;
  comm->device = device;
  joining->comms[rank] = comm;
  if (++joining->joined == nranks) {
    g_joining.erase(key);
    for (const CommPtr& c : joining->comms) g_comms[c.get()] = c;
    joining->complete = true;
    g_join_cv.notify_all();
  } else if (!g_join_cv.wait_until(lk, Deadline(),
                                   [&] { return joining->complete || !joining->failed.empty(); })) {
    joining->failed = Str("only %d of %d ranks joined within %g s (EMU_NCCL_TIMEOUT_S)",
                          joining->joined, nranks, TimeoutSeconds());
    if (auto it = g_joining.find(key); it != g_joining.end() && it->second == joining) {
      g_joining.erase(it);
    }
    g_join_cv.notify_all();
  }
  if (!joining->complete) {
    std::fprintf(stderr, "EMU NCCL: ncclCommInitRank (rank %d): %s\n", rank,
                 joining->failed.c_str());
    return ncclSystemError;
  }
  *out = comm.get();
  return ncclSuccess;
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1) return ncclInvalidArgument;
  std::vector<int> devices(ndev);
  for (int i = 0; i < ndev; ++i) {
    devices[i] = devlist != nullptr ? devlist[i] : i;
    if (devices[i] < 0 || devices[i] >= emu::DeviceCount()) {
      std::fprintf(stderr, "EMU NCCL: ncclCommInitAll: no device %d\n", devices[i]);
      return ncclInvalidArgument;
    }
    for (int j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        std::fprintf(stderr, "EMU NCCL: ncclCommInitAll: device %d twice\n", devices[i]);
        return ncclInvalidUsage;
      }
    }
  }
  auto group = std::make_shared<Group>(ndev);
  std::lock_guard lock(g_mu);
  for (int i = 0; i < ndev; ++i) {
    auto comm = std::make_shared<EmuNcclComm>();
    comm->group = group;
    comm->rank = i;
    comm->device = devices[i];
    g_comms[comm.get()] = comm;
    comms[i] = comm.get();
  }
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return Release(comm, false, "ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return Release(comm, true, "ncclCommAbort"); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t handle, ncclResult_t* async_error) {
  CommPtr comm = Find(handle, "ncclCommGetAsyncError");
  if (comm == nullptr || async_error == nullptr) return ncclInvalidArgument;
  *async_error = comm->async.load();
  if (*async_error == ncclSuccess) {
    // A group another rank broke (an abort, a failure): this rank's next operation fails, and
    // NCCL's watchdog would report the peer's failure as this one's asynchronous error too.
    std::lock_guard lock(comm->group->mu);
    if (!comm->group->broken.empty()) *async_error = ncclRemoteError;
  }
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (emulated NCCL: the reason is on stderr)";
    case ncclSystemError:
      return "unhandled system error (emulated NCCL: the reason is on stderr)";
    case ncclInternalError:
      return "internal error (emulated NCCL)";
    case ncclInvalidArgument:
      return "invalid argument (emulated NCCL: the reason is on stderr)";
    case ncclInvalidUsage:
      return "invalid usage (emulated NCCL: the reason is on stderr)";
    case ncclRemoteError:
      return "remote process exited or there was a network error (emulated NCCL: another rank "
             "failed, aborted or did not come; the reason is on stderr)";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  Item it{Kind::kAllGather, sendbuff, recvbuff, sendcount, datatype, 0};
  return Call(comm, stream, it, "ncclAllGather");
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  Item it{Kind::kBroadcast, sendbuff, recvbuff, count, datatype, root};
  return Call(comm, stream, it, "ncclBroadcast");
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  Item it{Kind::kSend, sendbuff, nullptr, count, datatype, peer};
  return Call(comm, stream, it, "ncclSend");
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  Item it{Kind::kRecv, nullptr, recvbuff, count, datatype, peer};
  return Call(comm, stream, it, "ncclRecv");
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) {
    std::fprintf(stderr, "EMU NCCL: ncclGroupEnd without ncclGroupStart\n");
    return ncclInvalidUsage;
  }
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<PendingCall> calls;
  calls.swap(t_group);
  const ncclResult_t error = t_group_error;
  t_group_error = ncclSuccess;
  if (error != ncclSuccess) return error;
  // One batch per communicator, in the order of their first calls.
  struct Batch {
    CommPtr comm;
    cudaStream_t stream;
    std::vector<Item> items;
  };
  std::vector<Batch> batches;
  for (PendingCall& call : calls) {
    auto it = std::find_if(batches.begin(), batches.end(),
                           [&](const Batch& b) { return b.comm == call.comm; });
    if (it == batches.end()) {
      batches.push_back({call.comm, call.stream, {}});
      it = batches.end() - 1;
    } else if (it->stream != call.stream) {
      std::fprintf(stderr,
                   "EMU NCCL: rank %d: one group call on two streams of one communicator "
                   "(not emulated)\n",
                   call.comm->rank);
      return ncclInvalidUsage;
    }
    it->items.push_back(call.item);
  }
  if (batches.size() == 1) return Submit(batches[0].comm, batches[0].stream, batches[0].items);
  // Several communicators (one thread driving several devices): their parts wait for each
  // other, so each is enqueued from a thread of its own, on its communicator's device.
  std::vector<ncclResult_t> results(batches.size(), ncclSuccess);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < batches.size(); ++i) {
    threads.emplace_back([&, i] {
      cudaSetDevice(batches[i].comm->device);
      results[i] = Submit(batches[i].comm, batches[i].stream, batches[i].items);
    });
  }
  for (std::thread& t : threads) t.join();
  for (ncclResult_t r : results) {
    if (r != ncclSuccess) return r;
  }
  return ncclSuccess;
}
