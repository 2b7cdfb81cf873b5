#include "core/engine/multi_node.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/parallel.h"
#include "core/base/socket.h"
#include "core/base/status_macros.h"
#include "core/cpu/cpu_model.h"
#include "core/cuda/runner.h"
#include "core/model/rank_group.h"
#include "core/model/remote_ranks.h"
#include "core/model/socket_communicator.h"
#include "core/model/weight_shard.h"

namespace glmserve {
namespace {

struct Ports {
  std::string host;
  int steps = 0;        // the step channels
  int collectives = 0;  // the socket communicator's leader (rank 0)
};

absl::StatusOr<Ports> PortsOf(const NodeGroupOptions& options) {
  ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(options.leader_address));
  if (hp.port < 1 || hp.port > 65534) {
    return absl::InvalidArgumentError(
        absl::StrCat("--leader_address port ", hp.port, ": the collectives take the next port"));
  }
  return Ports{hp.host, hp.port, hp.port + 1};
}

// The communicators of this process's ranks, made together: rank 0's (on the leader) waits
// for every other rank of the group to connect, so all of a process's ranks join at once.
// `rank0_listener`, when valid, is rank 0's listener, bound before any worker was accepted.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> JoinCollectives(
    const IndexRange& ranks, int size, const std::string& leader_host, const Ports& ports,
    const NodeGroupOptions& options, Socket rank0_listener) {
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> made(ranks.count);
  std::vector<std::thread> joins;
  for (int64_t i = 0; i < ranks.count; ++i) {
    joins.emplace_back([&, i] {
      SocketGroupOptions o;
      o.rank = static_cast<int>(ranks.begin + i);
      o.size = size;
      o.leader_address = absl::StrCat(leader_host, ":", ports.collectives);
      o.token = options.token;
      o.connect_timeout = options.join_timeout;
      o.collective_timeout = options.collective_timeout;
      made[i] = o.rank == 0 && rank0_listener.valid()
                    ? CreateSocketCommunicator(o, std::move(rank0_listener))
                    : CreateSocketCommunicator(o);
    });
  }
  for (std::thread& t : joins) t.join();
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& m : made) {
    RETURN_IF_ERROR(m.status());
    out.push_back(*std::move(m));
  }
  return out;
}

RankGroupOptions GroupOptions(const NodeGroupOptions& options, int64_t local_ranks) {
  RankGroupOptions g;
  g.threads_per_rank = options.threads_per_rank > 0
                           ? options.threads_per_rank
                           : std::max(1, NumThreads() / static_cast<int>(local_ranks));
  g.collective_timeout = options.collective_timeout;
  return g;
}

}  // namespace

absl::Status CheckNodeGroup(const ParallelConfig& parallel, const NodeGroupOptions& options) {
  if (options.nodes < 1 || options.node < 0 || options.node >= options.nodes) {
    return absl::InvalidArgumentError(absl::StrCat("--node_rank=", options.node, " of --nodes=",
                                                   options.nodes, ": need 0 <= node_rank < nodes"));
  }
  if (parallel.tensor_parallel < options.nodes || parallel.tensor_parallel % options.nodes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor_parallel=", parallel.tensor_parallel,
                     " ranks cannot be shared evenly by --nodes=", options.nodes, " processes"));
  }
  if (options.nodes > 1 && options.leader_address.empty()) {
    return absl::InvalidArgumentError(
        "--nodes > 1 needs --leader_address=host:port (the leader's step channel)");
  }
  return absl::OkStatus();
}

IndexRange NodeRanks(const ParallelConfig& parallel, const NodeGroupOptions& options, int node) {
  const int64_t per = parallel.tensor_parallel / options.nodes;
  return IndexRange{node * per, per};
}

absl::StatusOr<RankBackend> CpuRankBackend(const ParallelConfig& parallel, CpuMath cpu_math,
                                           const NodeGroupOptions& options) {
  ASSIGN_OR_RETURN(const Ports ports, PortsOf(options));
  const bool leader = options.node == 0;
  // The leader binds the collectives' port now, before it accepts any worker on the step port:
  // a port taken meanwhile (by any outgoing connection on this host, a same-host worker's own
  // included) would otherwise fail the group only after every worker had joined.
  auto rank0_listener = std::make_shared<Socket>();
  if (leader && options.nodes > 1) {
    ASSIGN_OR_RETURN(*rank0_listener, Listen("", ports.collectives));
  }
  RankBackend b;
  b.name = "CPU";
  b.make_welcome = [] { return std::string(); };
  b.join = [=](const IndexRange& mine, int size, const std::string&) {
    // The leader's own ranks reach its rank 0 on this machine.
    return JoinCollectives(mine, size, leader ? std::string("localhost") : ports.host, ports,
                           options, std::move(*rank0_listener));
  };
  b.make_rank = [=](const ModelWeights& whole, int rank, int,
                    Communicator* comm) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
    const RankLayout layout = LayoutOf(whole.config, parallel, rank, WeightSplitUnit(whole));
    ASSIGN_OR_RETURN(ModelWeights mine, ShardWeights(whole, layout));
    return std::unique_ptr<ModelRunner>(
        std::make_unique<CpuModel>(std::move(mine), cpu_math, layout, comm));
  };
  return b;
}

RankBackend CudaRankBackend(const ParallelConfig& parallel, Fp8TensorCores fp8_tensor_cores,
                            int first_device) {
  RankBackend b;
  b.name = "CUDA";
  b.make_welcome = [] { return NewCudaGroupId(); };
  b.join = [=](const IndexRange& mine, int size, const std::string& welcome) {
    return JoinCudaGroup(welcome, static_cast<int>(mine.begin), static_cast<int>(mine.count), size,
                         first_device);
  };
  b.make_rank = [=](const ModelWeights& whole, int rank, int local, Communicator* comm) {
    return CreateCudaRank(whole, parallel, rank, first_device + local, comm, fp8_tensor_cores);
  };
  return b;
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateLeaderRunner(ModelWeights weights,
                                                                const ParallelConfig& parallel,
                                                                const RankBackend& backend,
                                                                const NodeGroupOptions& options,
                                                                std::string* how) {
  RETURN_IF_ERROR(CheckNodeGroup(parallel, options));
  if (options.node != 0) return absl::InvalidArgumentError("the leader is node 0");
  RETURN_IF_ERROR(CheckParallelLayout(weights.config, parallel, WeightSplitUnit(weights)));
  ASSIGN_OR_RETURN(const HostPort address, ParseHostPort(options.leader_address));
  const absl::Time deadline = absl::Now() + options.join_timeout;
  ASSIGN_OR_RETURN(const std::string welcome, backend.make_welcome());
  ASSIGN_OR_RETURN(Socket listener, Listen("", address.port));
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RemoteChannel>> workers,
                   AcceptWorkers(listener, options.nodes - 1, options.token, welcome, deadline));
  const IndexRange mine = NodeRanks(parallel, options, 0);
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Communicator>> comms,
                   backend.join(mine, parallel.tensor_parallel, welcome));
  for (size_t w = 0; w < workers.size(); ++w) {
    const IndexRange theirs = NodeRanks(parallel, options, static_cast<int>(w + 1));
    comms.push_back(
        ChannelHandle(workers[w], static_cast<int>(theirs.begin), parallel.tensor_parallel));
  }
  if (how != nullptr) {
    *how = absl::StrCat(parallel.tensor_parallel, " ", backend.name, " ranks over ", options.nodes,
                        " processes (", mine.count,
                        " here); steps to the workers on "
                        "port ",
                        address.port);
  }
  auto whole = std::make_shared<const ModelWeights>(std::move(weights));
  ASSIGN_OR_RETURN(
      std::unique_ptr<RankGroup> group,
      RankGroup::Create(
          whole->config, parallel, GroupOptions(options, mine.count), std::move(comms),
          [&](int member, Communicator* comm) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
            if (member < mine.count) {
              return backend.make_rank(*whole, static_cast<int>(mine.begin) + member, member, comm);
            }
            ASSIGN_OR_RETURN(
                std::unique_ptr<RemoteRanks> remote,
                RemoteRanks::Create(workers[member - mine.count], whole->config, deadline));
            return std::unique_ptr<ModelRunner>(std::move(remote));
          }));
  return std::unique_ptr<ModelRunner>(std::move(group));
}

absl::Status RunWorker(ModelWeights weights, const ParallelConfig& parallel,
                       const RankBackend& backend, const NodeGroupOptions& options) {
  RETURN_IF_ERROR(CheckNodeGroup(parallel, options));
  if (options.node == 0) return absl::InvalidArgumentError("a worker is node 1 or later");
  RETURN_IF_ERROR(CheckParallelLayout(weights.config, parallel, WeightSplitUnit(weights)));
  const absl::Time deadline = absl::Now() + options.join_timeout;
  ASSIGN_OR_RETURN(auto joined,
                   ConnectToLeader(options.leader_address, options.node, options.token, deadline));
  std::shared_ptr<RemoteChannel> channel = std::move(joined.first);
  const IndexRange mine = NodeRanks(parallel, options, options.node);
  WorkerInfo info;
  std::unique_ptr<RankGroup> group;
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> comms =
      backend.join(mine, parallel.tensor_parallel, joined.second);
  if (comms.ok()) {
    absl::StatusOr<std::unique_ptr<RankGroup>> made = RankGroup::Create(
        weights.config, parallel, GroupOptions(options, mine.count), *std::move(comms),
        [&](int member, Communicator* comm) {
          return backend.make_rank(weights, static_cast<int>(mine.begin) + member, member, comm);
        });
    info.status = made.status();
    if (made.ok()) group = *std::move(made);
  } else {
    info.status = comms.status();
  }
  if (group != nullptr) {
    info.kv_bytes_per_token = group->kv_bytes_per_token();
    info.weight_bytes = group->weight_bytes();
    info.device_name = absl::StrCat(backend.name == "CPU" ? "cpu" : "cuda", " ranks ", mine.begin,
                                    "..", mine.end() - 1, " (", group->device_name(), ")");
  }
  weights = ModelWeights{};  // every rank holds its slice (views keep the mapping alive)
  StepLimits limits;
  limits.hidden_size = group != nullptr ? group->config().hidden_size : 0;
  const absl::Status served = ServeLeader(*channel, group.get(), info, limits);
  return info.status.ok() ? served : info.status;
}

}  // namespace glmserve
