// glm-server: serves a GLM-4.5-family model over gRPC (glmserve.v1.GlmService), with
// grpc.health.v1 liveness/readiness, reflection, Prometheus metrics, the KServe v2 service
// (inference.GRPCInferenceService) and, with --http_port, an OpenAI-compatible HTTP endpoint.
//
//   glm-server                                   # embedded glm-4.5-mini preset, CPU or GPU
//   glm-server --model=/models/GLM-4.5-Air --address=0.0.0.0 --port=50051 --metrics_port=9090
//   glm-server --model=glm-4.5-air:layers=8 --layers=4:8   # a pipeline stage
//
// SIGTERM / SIGINT drain: readiness goes NOT_SERVING, new calls get UNAVAILABLE, calls in
// flight get --drain_grace to finish, then the process exits 0.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/base/parallel.h"
#include "core/base/status_macros.h"
#include "core/cpu/quantize.h"
#include "core/cuda/runner.h"
#include "core/engine/multi_node.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "core/model/gpu_memory_plan.h"
#include "core/text/text_assets.h"
#include "server/plan_command.h"
#include "server/server.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, model, "glm-4.5-kjv",
          "checkpoint directory (with config.json), a model installed with glm-server "
          "(glm-4.5-kjv: the embedded default, a small trained model; docs/default_model.md) or "
          "a preset (glm-4.5-mini, glm-4.5-air:layers=2, tiny, ...; seeded random weights)");
ABSL_FLAG(std::string, tokenizer_dir, "",
          "directory with tokenizer.json (and tokenizer_config.json, generation_config.json) for "
          "text requests; default: the checkpoint directory, or for the glm-4.5-mini preset the "
          "tokenizer installed with glm-server; none: token ids only");
ABSL_FLAG(std::string, device, "auto", "auto (CUDA when a GPU is usable, else CPU), cpu or cuda");
ABSL_FLAG(std::string, cpu_math, "exact",
          "CPU backend arithmetic of the linear layers: exact (fp32 activations), bf16 (bf16 "
          "weights times activations rounded to bf16, as Transformers' bf16 forward; faster "
          "where vdpbf16ps is fast) or bf16_amx (the same rounding, Intel AMX tile products; "
          "emulated, slowly, without AMX); both bf16 modes also run GLM-4.5's attention in bf16; "
          "docs/cpu_math.md and docs/performance.md");
ABSL_FLAG(std::string, fp8_tensor_cores, "off",
          "CUDA FP8 GEMMs on FP8 tensor cores, activations quantized per token: auto (where the "
          "GPU supports them, else CUDA cores), on (refuse to start without them), off "
          "(docs/cuda.md)");
ABSL_FLAG(std::string, weight_dtype, "stored",
          "stored (the checkpoint's dtype); int8 (linear layers quantized at load, groups of "
          "32 with fp32 scales; CPU backend, needs --cpu_math=bf16 or bf16_amx); fp8_channel or "
          "fp8_block (a bf16 checkpoint made FP8 at load as the released FP8 checkpoints are: "
          "per-channel or 128x128 scales; both backends; docs/fp8.md)");
ABSL_FLAG(std::string, layers, "", "serve only layers BEGIN:END of the model (default: all)");
ABSL_FLAG(std::string, address, "127.0.0.1",
          "address to listen on (0.0.0.0 or :: for every interface, e.g. in a container)");
ABSL_FLAG(int, port, 50051, "gRPC port (0: pick a free one; the chosen port is printed)");
ABSL_FLAG(std::string, metrics_address, "", "address of /metrics (default: --address)");
ABSL_FLAG(int, metrics_port, 9090, "port of the Prometheus /metrics endpoint (-1: off, 0: any)");
ABSL_FLAG(int, http_port, -1,
          "port of the OpenAI-compatible HTTP endpoint on --address (-1: off, 0: any; e.g. 8000)");
ABSL_FLAG(int, http_threads, 32,
          "HTTP handler threads: completions served at once (each parses, tokenizes and waits on "
          "its own generation); the sockets are on --http_io_threads");
ABSL_FLAG(int, http_io_threads, 1,
          "threads that own the HTTP sockets (accept, parse, write; never model work)");
ABSL_FLAG(int, http_max_connections, 4096,
          "open connections per HTTP server (OpenAI and /metrics each); beyond: 503 and close");
ABSL_FLAG(absl::Duration, http_header_timeout, absl::Seconds(10),
          "a request's headers must arrive within this from its first byte (else 408)");
ABSL_FLAG(absl::Duration, http_body_timeout, absl::Seconds(60),
          "a request's whole body must arrive within this after its headers (else 408)");
ABSL_FLAG(absl::Duration, http_idle_timeout, absl::Seconds(30),
          "an idle keep-alive connection is closed after this; so is one whose client reads "
          "nothing of its response for this long");
ABSL_FLAG(int64_t, max_http_body_bytes, 16 << 20, "largest HTTP request body (beyond: 413)");
ABSL_FLAG(int64_t, http_max_body_bytes_in_flight, int64_t{1} << 30,
          "HTTP request bodies being read or served at once, in bytes (a chunked one counts "
          "--max_http_body_bytes); a request that would pass it gets 429 before its body");
ABSL_FLAG(int64_t, max_batch_tokens, 2048, "new tokens per engine step");
ABSL_FLAG(int64_t, max_running, 64, "sequences batched together at most");
ABSL_FLAG(int64_t, kv_capacity_tokens, 32768,
          "KV cache slots in tokens, shared by every running sequence");
ABSL_FLAG(int64_t, block_size, 16, "tokens per KV cache block");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "auto: the backend's choice (a GPU: bf16; the CPU: bf16 where its attention rounds K "
          "and V to bf16 anyway, the bf16, int8 and bf16_amx modes on bf16 weights: the same "
          "results in half the bytes; fp32 elsewhere); fp32 (CPU); bf16 (GLM-4.5 only on the "
          "CPU); fp8_e4m3: e4m3 with a scale per token and KV head, 3.9x fewer bytes than fp32 "
          "(GLM-4.5 only; docs/kv_cache.md)");
ABSL_FLAG(double, gpu_memory_fraction, 0,
          "0: the KV cache holds --kv_capacity_tokens; in (0, 1] on a CUDA device: the KV cache "
          "takes what this fraction of the device's memory leaves after the weights and the "
          "activations (docs/fp8.md); refused with the numbers when the model does not fit");
ABSL_FLAG(int32_t, mtp_draft_tokens, -1,
          "speculative decoding with the model's MTP layer (docs/mtp.md): tokens drafted per "
          "step (0: off, up to 8); -1: 1 when the model has an MTP layer its backend runs (the "
          "CPU backend), else off. Outputs are identical either way");
ABSL_FLAG(int64_t, mtp_max_batch, 4,
          "speculative decoding pauses in steps where more sequences than this decode (0: "
          "never); a big batch is compute-bound and drafts only add work (docs/mtp.md)");
ABSL_FLAG(bool, overlap_steps, true,
          "build each engine step while the one before it runs, where the backend samples "
          "tokens itself (CUDA) and speculative decoding is off (docs/engine.md); outputs are "
          "identical either way");
ABSL_FLAG(int64_t, max_waiting, 1024, "queued requests at most; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_sessions, 64, "Forward sessions held at most");
ABSL_FLAG(double, session_kv_fraction, 0.5,
          "share of the KV cache all Forward sessions together may pin (0..1)");
ABSL_FLAG(int64_t, max_session_tokens, 0,
          "positions one Forward session may hold (0: the whole sessions' share)");
ABSL_FLAG(absl::Duration, session_idle_timeout, absl::Minutes(10),
          "a session unused this long is closed");
ABSL_FLAG(absl::Duration, session_eviction_grace, absl::Seconds(1),
          "idle sessions unused this long are evicted (LRU) when other requests need their KV "
          "blocks");
ABSL_FLAG(int64_t, max_output_bytes_in_flight, int64_t{1} << 30,
          "bytes all Forward calls in flight may hold for their outputs; beyond: "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, verify_weights, "auto",
          "check checkpoint weights for NaN/Inf at load: full, sampled, off, or auto (full up to "
          "8 GiB of weights, sampled above)");
ABSL_FLAG(bool, prefix_caching, true, "share the KV blocks of identical prompt prefixes");
ABSL_FLAG(int64_t, max_prompt_tokens, 0, "longest prompt accepted (0: the model's positions)");
ABSL_FLAG(int64_t, max_new_tokens, 0, "largest max_new_tokens accepted (0: model's positions)");
ABSL_FLAG(int64_t, default_max_new_tokens, 256, "max_new_tokens of requests that leave it unset");
ABSL_FLAG(int64_t, max_concurrent_streams, 256, "Generate streams in flight at most (0: no limit)");
ABSL_FLAG(absl::Duration, default_deadline, absl::ZeroDuration(),
          "deadline of calls that carry none (0: none)");
ABSL_FLAG(absl::Duration, max_deadline, absl::ZeroDuration(),
          "longer deadlines are shortened to this (0: no cap)");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20, "largest gRPC message received or sent");
ABSL_FLAG(int, threads, 0, "compute threads (0: GLM_NUM_THREADS or every core)");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate chain (enables TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: clients must present a certificate it signed (mutual TLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file of accepted bearer tokens, one per line; every call except health then needs "
          "'authorization: Bearer <token>'");
ABSL_FLAG(absl::Duration, drain_grace, absl::Seconds(30),
          "on SIGTERM/SIGINT, how long calls in flight may take to finish");
ABSL_FLAG(uint64_t, seed, 0, "seed of the random weights (presets only)");
ABSL_FLAG(std::string, access_log, "",
          "one line per finished call (request id, rpc, code, tokens, queue/TTFT/total ms) "
          "appended to this file, or '-' for stdout (default: off)");
ABSL_FLAG(std::string, log_format, "text", "access log lines: text (key=value) or json");
ABSL_FLAG(bool, plan, false,
          "print the memory plan of --model over --devices (one tensor-parallel rank each: "
          "weights, activations and KV tokens per rank) and exit: 0 when it fits, 1 with the "
          "numbers when not; reads the config only (docs/parallel_memory.md)");
ABSL_FLAG(std::string, devices, "",
          "for --plan: COUNTxSIZE of identical devices, e.g. 8x80GB, 4x141GB, 2x80GiB, 8xH200");
ABSL_FLAG(int, tensor_parallel, 0,
          "ranks of a tensor-parallel group (docs/parallel.md). Serving: 0 or 1 one rank; N > 1 "
          "N ranks in this process: with --device=cuda (or auto with a GPU) one per GPU 0..N-1 "
          "over NCCL, with --device=cpu threads, each a share of --threads, pinned per NUMA node "
          "when there are N nodes. --plan: 0 is the device count (one rank a device)");
ABSL_FLAG(int, nodes, 1,
          "processes of a tensor-parallel group (docs/parallel.md \"Ranks in "
          "several processes\"): --tensor_parallel ranks shared evenly; node 0 (the leader) "
          "serves, the others (--node_rank >= 1) follow its steps");
ABSL_FLAG(int, node_rank, 0, "this process's node in the group: 0 the leader, 1.. workers");
ABSL_FLAG(std::string, leader_address, "",
          "with --nodes > 1: host:port of the leader's step channel (the leader listens on the "
          "port, and on port + 1 for the collectives; workers connect to both)");
ABSL_FLAG(std::string, group_token, "glmserve",
          "with --nodes > 1: only processes presenting the same token join the group");
ABSL_FLAG(bool, expert_parallel, true,
          "tensor parallel: routed experts whole per rank (false: every expert's width split)");

namespace {

absl::StatusOr<glmserve::LayerSpan> ParseLayers(const std::string& text) {
  glmserve::LayerSpan span;
  if (text.empty()) return span;
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &span.begin) ||
      !absl::SimpleAtoi(parts[1], &span.end)) {
    return absl::InvalidArgumentError(absl::StrCat("--layers='", text, "' is not BEGIN:END"));
  }
  return span;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The directory glm-server's binary is in ("" if unknown).
std::string ExecutableDir() {
  char buffer[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  if (n <= 0) return "";
  const std::string path(buffer, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// The models installed with glm-server (models/<name>, docs/default_model.md): copied next to
// the binary by the build and installed under share/glmserve (and so into the Docker image).
// "" when `name` is not one of them.
std::string InstalledModelDir(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name.find(':') != std::string::npos ||
      name == "." || name == "..") {
    return "";
  }
  const std::string exe = ExecutableDir();
  for (const std::string& dir :
       {exe + "/models/" + name, exe + "/../share/glmserve/models/" + name}) {
    if (IsDirectory(dir)) return dir;
  }
  return "";
}

// --model as the loader takes it: a directory as given; an installed model's name as its
// directory (when it holds a checkpoint: glm-4.5-mini's holds only its tokenizer); else the
// name (a preset, or an error the loader reports).
std::string ModelPath() {
  const std::string model = absl::GetFlag(FLAGS_model);
  if (IsDirectory(model)) return model;
  const std::string installed = InstalledModelDir(model);
  if (!installed.empty() && IsRegularFile(installed + "/config.json")) return installed;
  return model;
}

// Where the text assets come from: --tokenizer_dir; a checkpoint's own directory; for the
// glm-4.5-mini preset the small tokenizer shipped with it (models/glm-4.5-mini). "" : none
// (token ids only).
std::string TextAssetsDir(const std::string& model_path) {
  const std::string flag = absl::GetFlag(FLAGS_tokenizer_dir);
  if (flag == "none") return "";
  if (!flag.empty()) return flag;
  if (IsDirectory(model_path)) return model_path;
  const std::string preset = model_path.substr(0, model_path.find(':'));
  if (preset != "glm-4.5-mini") return "";
  if (std::string dir = InstalledModelDir(preset); !dir.empty()) return dir;
  std::fprintf(stderr,
               "glm-server: warning: the glm-4.5-mini tokenizer is not installed next to the "
               "binary; serving token ids only (pass --tokenizer_dir=models/glm-4.5-mini)\n");
  return "";
}

glmserve::ServerOptions OptionsFromFlags() {
  glmserve::ServerOptions o;
  o.address = absl::GetFlag(FLAGS_address);
  o.port = absl::GetFlag(FLAGS_port);
  o.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.http.port = absl::GetFlag(FLAGS_http_port);
  o.http.threads = absl::GetFlag(FLAGS_http_threads);
  o.http.max_body_bytes = absl::GetFlag(FLAGS_max_http_body_bytes);
  o.http.io_threads = absl::GetFlag(FLAGS_http_io_threads);
  o.http.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  o.http.header_timeout = absl::GetFlag(FLAGS_http_header_timeout);
  o.http.body_timeout = absl::GetFlag(FLAGS_http_body_timeout);
  o.http.idle_timeout = absl::GetFlag(FLAGS_http_idle_timeout);
  o.http.max_body_bytes_in_flight = absl::GetFlag(FLAGS_http_max_body_bytes_in_flight);
  o.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  o.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.service.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  o.service.default_deadline = absl::GetFlag(FLAGS_default_deadline);
  o.service.max_deadline = absl::GetFlag(FLAGS_max_deadline);
  o.engine.limits.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  o.engine.limits.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.engine.limits.default_max_new_tokens = absl::GetFlag(FLAGS_default_max_new_tokens);
  o.engine.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  o.engine.max_running = absl::GetFlag(FLAGS_max_running);
  o.engine.kv_capacity_tokens = absl::GetFlag(FLAGS_kv_capacity_tokens);
  o.engine.block_size = absl::GetFlag(FLAGS_block_size);
  o.engine.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  o.engine.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  o.engine.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  o.mtp_draft_tokens = absl::GetFlag(FLAGS_mtp_draft_tokens);
  o.engine.mtp_max_batch = absl::GetFlag(FLAGS_mtp_max_batch);
  o.engine.overlap_steps = absl::GetFlag(FLAGS_overlap_steps);
  o.engine.session_kv_fraction = absl::GetFlag(FLAGS_session_kv_fraction);
  o.engine.max_session_tokens = absl::GetFlag(FLAGS_max_session_tokens);
  o.engine.session_idle_timeout = absl::GetFlag(FLAGS_session_idle_timeout);
  o.engine.session_eviction_grace = absl::GetFlag(FLAGS_session_eviction_grace);
  o.service.max_output_bytes_in_flight = absl::GetFlag(FLAGS_max_output_bytes_in_flight);
  o.model_name = absl::GetFlag(FLAGS_model);
  o.access_log = absl::GetFlag(FLAGS_access_log);
  // Checked by ValidateMainFlags.
  o.log_format = glmserve::ParseLogFormat(absl::GetFlag(FLAGS_log_format))
                     .value_or(glmserve::LogFormat::kText);
  return o;
}

// Signals are blocked in every thread (the mask is inherited by the threads gRPC and the
// engine start later) and taken synchronously by one thread, so that the drain runs as
// ordinary code rather than inside a signal handler.
sigset_t BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

const glmserve::cli::ProgramHelp& Help() {
  static const glmserve::cli::ProgramHelp* help = new glmserve::cli::ProgramHelp{
      "glm-server",
      "serves a GLM-4.5-family model over gRPC, with health, reflection and /metrics",
      {"glm-server                                   # glm-4.5-kjv (embedded) on 127.0.0.1:50051",
       "glm-server --model=/models/GLM-4.5-Air --address=0.0.0.0",
       "glm-server --model=glm-4.5-air:layers=8 --layers=4:8   # a pipeline stage",
       "glm-server --plan --model=glm-4.5-fp8 --devices=8x80GB  # memory plan, then exit"},
      {{"Model and device",
        {"model", "tokenizer_dir", "device", "layers", "threads", "seed", "verify_weights",
         "cpu_math", "weight_dtype", "fp8_tensor_cores"}},
       {"Network",
        {"address", "port", "metrics_address", "metrics_port", "max_message_bytes", "http_port",
         "http_threads", "http_io_threads", "http_max_connections", "http_header_timeout",
         "http_body_timeout", "http_idle_timeout", "max_http_body_bytes",
         "http_max_body_bytes_in_flight"}},
       {"Engine and KV cache",
        {"kv_capacity_tokens", "kv_cache_dtype", "gpu_memory_fraction", "block_size",
         "max_batch_tokens", "max_running", "max_waiting", "prefix_caching", "overlap_steps",
         "mtp_draft_tokens", "mtp_max_batch"}},
       {"Forward sessions",
        {"max_sessions", "session_kv_fraction", "max_session_tokens", "session_idle_timeout",
         "session_eviction_grace"}},
       {"Request limits",
        {"max_prompt_tokens", "max_new_tokens", "default_max_new_tokens", "max_concurrent_streams",
         "default_deadline", "max_deadline", "max_output_bytes_in_flight"}},
       {"Security", {"tls_cert", "tls_key", "tls_client_ca", "auth_token_file"}},
       {"Logging", {"access_log", "log_format"}},
       {"Parallelism and memory plans",
        {"tensor_parallel", "expert_parallel", "nodes", "node_rank", "leader_address",
         "group_token", "plan", "devices"}},
       {"Shutdown", {"drain_grace"}}},
      "server/main.cc",
      "SIGTERM/SIGINT drain: readiness goes NOT_SERVING, calls in flight get --drain_grace."};
  return *help;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "glm-server: %s\n", status.ToString().c_str());
  return 1;
}

// A flag outside its range: the message and exit code 2 (a usage error, as for an unknown
// flag), before anything starts.
int BadFlag(const absl::Status& status) {
  std::fprintf(stderr, "glm-server: invalid flag: %s\n", std::string(status.message()).c_str());
  return 2;
}

// Flags main reads itself (the rest are checked by ValidateServerOptions).
// --gpu_memory_fraction: sizes the KV cache from the device's memory
// (core/model/gpu_memory_plan.h). The weights are already on the device: they count against this
// process's budget, so they are added back to the free memory before planning.
absl::Status PlanKvCache(const glmserve::ModelRunner& runner, double fraction,
                         glmserve::GlmServer* server) {
  if (runner.device_name() == "cpu") {
    return absl::InvalidArgumentError(
        "--gpu_memory_fraction applies to the CUDA backend; the model runs on the CPU");
  }
  ASSIGN_OR_RETURN(glmserve::GpuMemoryInfo device, glmserve::CudaMemoryInfo());
  const glmserve::ModelConfig& c = runner.config();
  glmserve::GpuMemoryRequest request;
  request.gpu_memory_fraction = fraction;
  request.weight_bytes = runner.weight_bytes();
  device.free_bytes = std::min(device.total_bytes, device.free_bytes + request.weight_bytes);
  request.activation_bytes = glmserve::ActivationArenaBytes(
      c, absl::GetFlag(FLAGS_max_batch_tokens), absl::GetFlag(FLAGS_max_running));
  request.kv_bytes_per_token = runner.kv_bytes_per_token();
  request.block_size = absl::GetFlag(FLAGS_block_size);
  request.min_kv_tokens = std::min<int64_t>(c.max_position_embeddings, 4096);
  ASSIGN_OR_RETURN(const glmserve::GpuMemoryPlan plan, glmserve::PlanGpuMemory(device, request));
  std::printf("glm-server: GPU memory plan: %s\n", plan.Describe().c_str());
  server->SetKvCapacityTokens(plan.kv_tokens);
  return absl::OkStatus();
}

absl::Status ValidateMainFlags() {
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads < 0 || threads > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--threads=", threads, " is outside [0, 4096]"));
  }
  if (absl::GetFlag(FLAGS_drain_grace) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_grace must be >= 0");
  }
  if (absl::Status s = glmserve::ParseLogFormat(absl::GetFlag(FLAGS_log_format)).status();
      !s.ok()) {
    return s;
  }
  return glmserve::ParseVerifyWeights(absl::GetFlag(FLAGS_verify_weights)).status();
}

// --plan: the plan of --model over --devices, printed; no server starts and no weight loads.
int PrintPlan(bool fp8_kv) {
  glmserve::PlanCommandOptions o;
  o.model = ModelPath();
  o.devices = absl::GetFlag(FLAGS_devices);
  o.tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  o.expert_parallel = absl::GetFlag(FLAGS_expert_parallel);
  o.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  o.weight_dtype = absl::GetFlag(FLAGS_weight_dtype);
  o.fp8_kv = fp8_kv;
  o.mtp_cache = absl::GetFlag(FLAGS_mtp_draft_tokens) != 0;
  o.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  o.max_running = absl::GetFlag(FLAGS_max_running);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  const absl::StatusOr<std::string> plan = glmserve::PlanCommand(o);
  if (!plan.ok()) return Fail(plan.status());
  std::printf("%s", plan->c_str());
  return 0;
}

// The flags that choose and load the model, parsed and checked before anything starts.
struct ModelFlags {
  glmserve::DeviceKind device = glmserve::DeviceKind::kAuto;
  glmserve::CpuMath cpu_math = glmserve::CpuMath::kExact;
  glmserve::Fp8TensorCores fp8_tensor_cores = glmserve::Fp8TensorCores::kOff;
  glmserve::WeightQuant quant = glmserve::WeightQuant::kStored;
  glmserve::LayerSpan span;
};

glmserve::NodeGroupOptions NodeOptionsFromFlags() {
  glmserve::NodeGroupOptions o;
  o.nodes = absl::GetFlag(FLAGS_nodes);
  o.node = absl::GetFlag(FLAGS_node_rank);
  o.leader_address = absl::GetFlag(FLAGS_leader_address);
  o.token = absl::GetFlag(FLAGS_group_token);
  return o;
}

// The ranks of a group over several processes: CUDA ranks (a GPU each) or CPU ranks.
absl::StatusOr<glmserve::RankBackend> RankBackendFor(const ModelFlags& f,
                                                     const glmserve::ParallelConfig& parallel,
                                                     const glmserve::NodeGroupOptions& nodes) {
  if (f.device == glmserve::DeviceKind::kCuda) {
    return glmserve::CudaRankBackend(parallel, f.fp8_tensor_cores);
  }
  return glmserve::CpuRankBackend(parallel, f.cpu_math, nodes);
}

absl::StatusOr<ModelFlags> ParseModelFlags() {
  ModelFlags f;
  ASSIGN_OR_RETURN(f.device, glmserve::ParseDeviceKind(absl::GetFlag(FLAGS_device)));
  ASSIGN_OR_RETURN(f.cpu_math, glmserve::ParseCpuMath(absl::GetFlag(FLAGS_cpu_math)));
  ASSIGN_OR_RETURN(f.fp8_tensor_cores,
                   glmserve::ParseFp8TensorCores(absl::GetFlag(FLAGS_fp8_tensor_cores)));
  ASSIGN_OR_RETURN(f.quant, glmserve::ParseWeightQuant(absl::GetFlag(FLAGS_weight_dtype)));
  RETURN_IF_ERROR(glmserve::CheckWeightQuantMath(f.quant, f.cpu_math));
  ASSIGN_OR_RETURN(f.span, ParseLayers(absl::GetFlag(FLAGS_layers)));
  const int tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  if (tensor_parallel < 0) {
    return absl::InvalidArgumentError("--tensor_parallel must be >= 0");
  }
  if (absl::GetFlag(FLAGS_nodes) > 1) {  // a group over several processes
    RETURN_IF_ERROR(glmserve::CheckNodeGroup(
        glmserve::ParallelConfig{tensor_parallel, absl::GetFlag(FLAGS_expert_parallel)},
        NodeOptionsFromFlags()));
  }
  if (tensor_parallel > 1 && f.device == glmserve::DeviceKind::kAuto) {
    f.device =
        glmserve::CudaDeviceAvailable() ? glmserve::DeviceKind::kCuda : glmserve::DeviceKind::kCpu;
  }
  return f;
}

// The tokenizer and chat template: --tokenizer_dir, else the checkpoint's own files (none for
// a preset without them).
absl::StatusOr<glmserve::TextAssets> LoadTextFromFlags() {
  const std::string dir = TextAssetsDir(ModelPath());
  if (dir.empty()) return glmserve::TextAssets{};
  const bool explicit_dir = !absl::GetFlag(FLAGS_tokenizer_dir).empty();
  if (explicit_dir && !IsDirectory(dir)) {
    return absl::NotFoundError(absl::StrCat("--tokenizer_dir=", dir, " is not a directory"));
  }
  ASSIGN_OR_RETURN(glmserve::TextAssets loaded, glmserve::LoadTextAssets(dir));
  if (explicit_dir && loaded.tokenizer == nullptr) {
    return absl::NotFoundError(absl::StrCat("--tokenizer_dir=", dir, " has no tokenizer.json"));
  }
  return loaded;
}

struct LoadedModel {
  std::unique_ptr<glmserve::ModelRunner> runner;
  glmserve::DType weight_dtype = glmserve::DType::kBF16;  // as stored, before quantization
};

// The weights (--model, --layers, --seed), quantized when asked, on the chosen runner, with a
// progress line at the start, every 2 s and at the end of reading (or uploading) them.
absl::StatusOr<LoadedModel> LoadModelFromFlags(const ModelFlags& f) {
  glmserve::RandomWeightOptions random;
  random.seed = absl::GetFlag(FLAGS_seed);
  // --device=cuda: an FP8 preset's codes are generated on the device (no host copy), and a
  // checkpoint's mapped shards are read once, by the streaming upload (its progress line),
  // rather than paged in first.
  const bool on_cuda = f.device == glmserve::DeviceKind::kCuda;
  random.fp8_codes_on_device = on_cuda;
  glmserve::LoadOptions load;
  load.verify = *glmserve::ParseVerifyWeights(absl::GetFlag(FLAGS_verify_weights));
  // Owned by the callback itself: the CUDA runner keeps its copy.
  auto last_progress = std::make_shared<absl::Time>(absl::InfinitePast());
  const glmserve::LoadProgressCallback progress = [last_progress,
                                                   on_cuda](const glmserve::LoadProgress& p) {
    const absl::Time now = absl::Now();
    if (p.bytes_done < p.bytes_total && p.bytes_done > 0 &&
        now - *last_progress < absl::Seconds(2)) {
      return;
    }
    *last_progress = now;
    std::printf("glm-server: %s %s: %s\n", on_cuda ? "uploading" : "loading",
                absl::GetFlag(FLAGS_model).c_str(), glmserve::DescribeLoadProgress(p).c_str());
    std::fflush(stdout);
  };
  if (!on_cuda) load.progress = progress;
  ASSIGN_OR_RETURN(glmserve::ModelWeights weights,
                   glmserve::LoadModel(ModelPath(), f.span, random, load));
  LoadedModel model;
  model.weight_dtype = weights.weight_dtype;
  if (f.quant != glmserve::WeightQuant::kStored) {
    const absl::Time t_quant = absl::Now();
    const int64_t stored_bytes = weights.ParameterBytes();
    RETURN_IF_ERROR(glmserve::QuantizeWeights(&weights, f.quant));
    std::printf("glm-server: linear layers quantized to %s at load: %.2f GB -> %.2f GB in %.1f s\n",
                glmserve::WeightQuantName(f.quant), stored_bytes / 1e9,
                weights.ParameterBytes() / 1e9, absl::ToDoubleSeconds(absl::Now() - t_quant));
  }
  const int tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  if (tensor_parallel > 1) {  // ranks in this process (ParseModelFlags resolved the device)
    glmserve::ParallelConfig parallel;
    parallel.tensor_parallel = tensor_parallel;
    parallel.expert_parallel = absl::GetFlag(FLAGS_expert_parallel);
    std::string pinning;
    const glmserve::NodeGroupOptions nodes = NodeOptionsFromFlags();
    if (nodes.nodes > 1 && nodes.node > 0) {
      // A worker: joins the leader and runs its steps until the leader goes away.
      std::printf("glm-server: node %d of %d, joining the leader at %s\n", nodes.node, nodes.nodes,
                  nodes.leader_address.c_str());
      std::fflush(stdout);
      ASSIGN_OR_RETURN(const glmserve::RankBackend backend, RankBackendFor(f, parallel, nodes));
      const absl::Status stopped =
          glmserve::RunWorker(std::move(weights), parallel, backend, nodes);
      return absl::Status(stopped.code(), absl::StrCat("worker node ", nodes.node,
                                                       " stopped: ", stopped.message()));
    }
    if (nodes.nodes > 1) {
      std::printf("glm-server: leader of %d processes: waiting for the workers on %s\n",
                  nodes.nodes, nodes.leader_address.c_str());
      std::fflush(stdout);
      ASSIGN_OR_RETURN(const glmserve::RankBackend backend, RankBackendFor(f, parallel, nodes));
      ASSIGN_OR_RETURN(model.runner, glmserve::CreateLeaderRunner(std::move(weights), parallel,
                                                                  backend, nodes, &pinning));
      std::printf("glm-server: %s\n", pinning.c_str());
      return model;
    }
    if (f.device == glmserve::DeviceKind::kCuda) {
      ASSIGN_OR_RETURN(model.runner,
                       glmserve::CreateCudaTensorParallelRunner(
                           std::move(weights), parallel, progress, f.fp8_tensor_cores, &pinning));
      std::printf("glm-server: %s\n", pinning.c_str());
      return model;
    }
    ASSIGN_OR_RETURN(model.runner, glmserve::CreateCpuTensorParallelRunner(
                                       std::move(weights), parallel, f.cpu_math, 0, &pinning));
    std::printf("glm-server: %d CPU ranks: %s\n", tensor_parallel, pinning.c_str());
    return model;
  }
  ASSIGN_OR_RETURN(model.runner,
                   glmserve::CreateModelRunner(std::move(weights), f.device, f.cpu_math,
                                               on_cuda ? progress : nullptr, f.fp8_tensor_cores));
  return model;
}

void PrintListening(const glmserve::GlmServer& server) {
  std::printf("glm-server: listening on %s", server.target().c_str());
  if (server.metrics_port() >= 0) std::printf(", metrics on port %d", server.metrics_port());
  if (server.http_port() >= 0) std::printf(", OpenAI HTTP on port %d", server.http_port());
  std::printf("\n");
  std::fflush(stdout);
}

// Each HTTP connection is a descriptor: take the hard limit (Debian's soft default, 1024, is
// below --http_max_connections), as servers built for many connections do.
void RaiseDescriptorLimit() {
  if (rlimit nofile; getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (std::optional<int> code = glmserve::cli::HandleHelpAndVersion(argc, argv, Help()))
    return *code;
  absl::SetProgramUsageMessage(
      "Serves a GLM-4.5-family model over gRPC.\n"
      "  glm-server --model=glm-4.5-mini --port=50051 --metrics_port=9090");
  absl::ParseCommandLine(argc, argv);
  glmserve::ServerOptions options = OptionsFromFlags();
  absl::StatusOr<glmserve::KvCacheDType> kv_dtype =
      glmserve::ParseKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype));
  if (!kv_dtype.ok()) return BadFlag(kv_dtype.status());
  options.engine.kv_cache_dtype = *kv_dtype;
  if (absl::Status s = ValidateMainFlags(); !s.ok()) return BadFlag(s);
  if (absl::Status s = glmserve::ValidateServerOptions(options); !s.ok()) return BadFlag(s);
  if (absl::GetFlag(FLAGS_plan)) {
    if (*kv_dtype == glmserve::KvCacheDType::kFp32) {  // the plan is a GPU one: bf16 or FP8
      return BadFlag(absl::InvalidArgumentError(
          "--plan plans GPU devices, whose KV cache is bf16 (auto, bf16) or fp8_e4m3; "
          "--kv_cache_dtype=fp32 is the CPU backend's"));
    }
    return PrintPlan(*kv_dtype == glmserve::KvCacheDType::kFp8E4M3);
  }
  absl::StatusOr<ModelFlags> model_flags = ParseModelFlags();
  if (!model_flags.ok()) return BadFlag(model_flags.status());
  glmserve::ReturnLargeAllocationsToTheSystem();
  RaiseDescriptorLimit();
  if (!options.auth_token_file.empty() && options.tls.cert_file.empty()) {
    std::fprintf(stderr,
                 "glm-server: warning: --auth_token_file without --tls_cert: bearer tokens "
                 "travel in plaintext; use TLS unless the network is trusted\n");
  }
  if (absl::GetFlag(FLAGS_nodes) > 1 && absl::GetFlag(FLAGS_node_rank) > 0) {
    // A worker process serves no front end: it loads its ranks and follows the leader's steps
    // (LoadModelFromFlags returns only when it stops, with why); exiting non-zero lets the
    // orchestrator restart the group. SIGTERM keeps its default action: nothing to drain.
    if (absl::GetFlag(FLAGS_threads) > 0) glmserve::SetNumThreads(absl::GetFlag(FLAGS_threads));
    const absl::StatusOr<LoadedModel> stopped = LoadModelFromFlags(*model_flags);
    return Fail(stopped.ok() ? absl::InternalError("worker returned") : stopped.status());
  }
  const sigset_t signals = BlockShutdownSignals();
  absl::Notification stop;
  std::thread signal_thread([&signals, &stop] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "glm-server: signal %d, draining\n", sig);
    stop.Notify();
  });
  signal_thread.detach();

  if (absl::GetFlag(FLAGS_threads) > 0) glmserve::SetNumThreads(absl::GetFlag(FLAGS_threads));

  absl::StatusOr<std::unique_ptr<glmserve::GlmServer>> server = glmserve::GlmServer::Start(options);
  if (!server.ok()) return Fail(server.status());
  PrintListening(**server);

  const absl::Time t_load = absl::Now();
  absl::StatusOr<glmserve::TextAssets> text = LoadTextFromFlags();
  if (!text.ok()) return Fail(text.status());
  absl::StatusOr<LoadedModel> model = LoadModelFromFlags(*model_flags);
  if (!model.ok()) return Fail(model.status());
  const std::string device_name = model->runner->device_name();
  if (const double fraction = absl::GetFlag(FLAGS_gpu_memory_fraction); fraction != 0) {
    // The cache's element format first (Engine::Create sets it again): the plan counts the
    // bytes per token of the cache the engine will make (an FP8 cache: about a quarter).
    if (absl::Status s = model->runner->SetKvCacheDType(*kv_dtype); !s.ok()) return Fail(s);
    // And the MTP layer's cache layer, when speculation may use it (auto decides later; its
    // layer is then reserved either way).
    if (absl::GetFlag(FLAGS_mtp_draft_tokens) != 0 && model->runner->has_mtp()) {
      if (absl::Status s = model->runner->EnableMtp(); !s.ok()) return Fail(s);
    }
    if (absl::Status s = PlanKvCache(*model->runner, fraction, server->get()); !s.ok()) {
      return Fail(s);
    }
  }
  if (!stop.HasBeenNotified()) {
    if (absl::Status s =
            (*server)->Serve(std::move(model->runner), model->weight_dtype, *std::move(text));
        !s.ok()) {
      return Fail(s);
    }
    std::printf("%s", (*server)->StartupSummary().c_str());
    std::printf("glm-server: ready: %s on %s (loaded and warmed up in %.2f s)\n",
                absl::GetFlag(FLAGS_model).c_str(), device_name.c_str(),
                absl::ToDoubleSeconds(absl::Now() - t_load));
    std::fflush(stdout);
    stop.WaitForNotification();
  }
  const absl::Time t_drain = absl::Now();
  (*server)->Drain(absl::GetFlag(FLAGS_drain_grace));
  server->reset();
  std::printf("glm-server: stopped (drained in %.2f s)\n",
              absl::ToDoubleSeconds(absl::Now() - t_drain));
  std::fflush(stdout);
  return 0;
}
