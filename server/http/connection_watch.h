// Whether an HTTP client is still there while its request waits on the engine.
//
// Why: civetweb runs a handler on a worker thread and only reports a vanished client when a
// write fails, and a non-streaming completion writes nothing until it is done. To cancel the
// engine request as soon as the client disconnects (as the gRPC API does through OnCancel),
// the handler finds its connection's socket (the one whose peer and local ports are the
// request's) and peeks at it: end-of-stream or an error means the client is gone. Peeking
// never consumes bytes, so a pipelined next request is left for civetweb.
#pragma once

#include <string>

namespace glmserve {

class ConnectionWatch {
 public:
  // The connected socket of this process from `remote_addr`:`remote_port` to local port
  // `local_port`; without one (not found) PeerClosed always answers false.
  ConnectionWatch(const std::string& remote_addr, int remote_port, int local_port);

  // True once the peer has closed or reset the connection. Never blocks.
  bool PeerClosed() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace glmserve
