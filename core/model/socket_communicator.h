// A Communicator (core/model/communicator.h) between CPU ranks in different processes or
// machines, over TCP: the ranks of a Kubernetes LeaderWorkerSet, where the leader pod is rank 0
// and every worker knows only the leader's address.
//
// Star topology through rank 0: every collective sends each rank's values to rank 0, which
// combines them and sends back what each rank needs. A reduction adds ALL ranks' values in rank
// order 0, 1, ..., N - 1, element by element, starting from rank 0's: the same bits as
// CreateThreadGroup, whatever the count. Why a star: a leader address is all the ranks know,
// and at decode sizes (a few KB a collective) the extra hop costs latency, not bandwidth; the
// price is N times the payload through rank 0's link for large (prefill) collectives.
//
// Every frame names its collective (kind, root, sequence number) and carries its element
// count; rank 0 checks them against its own, so ranks that run different steps fail loudly
// instead of adding unrelated numbers.
//
// Failures poison the group as the interface says: a collective that does not complete within
// `collective_timeout` returns DEADLINE_EXCEEDED; a rank whose connection closes (its process
// exited, was killed, or closed its communicator) fails the others with UNAVAILABLE naming it
// (rank 0 relays the reason to the other ranks before it shuts their connections); Abort(why)
// tells the peers `why` when it can and shuts the connections down, which wakes a rank blocked
// in a collective on this or any other process.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/base/socket.h"
#include "core/model/communicator.h"

namespace glmserve {

struct SocketGroupOptions {
  int rank = 0;
  int size = 1;
  // "host:port" of rank 0. Rank 0 listens on that port (on every interface unless
  // `listen_host` says otherwise: its own service name may not resolve yet while it starts);
  // the other ranks connect to it.
  std::string leader_address;
  std::string listen_host;
  // The same on every rank of one group (a deployment's name and generation, say): a rank of
  // another group, or of an earlier incarnation of this one, that reaches the leader is refused.
  std::string token;
  // How long ranks wait for the group to assemble: workers may start long before the leader
  // has loaded its model, and the leader waits for every worker.
  absl::Duration connect_timeout = absl::Minutes(10);
  // The longest one collective waits for the other ranks.
  absl::Duration collective_timeout = absl::Seconds(60);
};

// This process's rank of the group, once all `size` ranks have joined (rank 0 returns when
// every worker has said hello; a worker when rank 0 has welcomed the whole group).
// INVALID_ARGUMENT for bad options; FAILED_PRECONDITION when rank 0 refused this rank (another
// group's token, a different size, a rank already taken); DEADLINE_EXCEEDED when the group did
// not assemble within connect_timeout.
absl::StatusOr<std::unique_ptr<Communicator>> CreateSocketCommunicator(
    const SocketGroupOptions& options);

// Rank 0 with a listener it opened itself (Listen(host, 0) in tests, to learn an ephemeral port
// before the workers start); the other ranks call the overload above.
absl::StatusOr<std::unique_ptr<Communicator>> CreateSocketCommunicator(
    const SocketGroupOptions& options, Socket listener);

}  // namespace glmserve
