// One HTTP/1.1 connection of glm-server's HTTP server (server/http/http_server.h): the state
// machine that reads a request (idle, header and body deadlines, strict framing), routes it,
// hands it to the handler pool and writes what the handler queues, all on the connection's
// strand. Handler threads talk to it only through Queue / Finish / gone (thread-safe).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http/parser.hpp"
#include "boost/beast/http/string_body.hpp"
#include "server/http/handler_pool.h"
#include "server/http/http_server.h"

namespace glmserve {

// What every connection of one server shares; owned jointly by the server and its
// connections, so that it outlives the last connection whatever the order of destruction.
struct ConnectionContext {
  HttpOptions options;
  HttpService* service = nullptr;
  std::unique_ptr<HandlerPool> pool;
  std::atomic<int> open{0};
  std::atomic<int64_t> body_bytes{0};  // reserved by the bodies being read or served
  std::mutex mu;                       // guards `live`
  std::unordered_map<Connection*, std::weak_ptr<Connection>> live;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(boost::asio::ip::tcp::socket socket, std::shared_ptr<ConnectionContext> context);
  ~Connection();
  void Start();

  // From a handler thread. Queues bytes for the socket; waits while more than
  // kMaxQueuedBytes are queued (the peer reads slowly). False once the peer is gone.
  bool Queue(std::string bytes);
  // The handler is done: once its bytes are written, read the next request (or close).
  void Finish(bool close);
  bool gone() const { return gone_.load(); }
  const std::string& peer() const { return peer_; }

  // From the server's Stop: closes the connection if it is between requests (idle, or still
  // reading a request); with `all`, whatever it does.
  void CloseIfIdle(bool all);

 private:
  enum class Phase { kIdle, kHeader, kBody, kServing, kLinger, kClosed };

  void ReadRequest();
  void ReadHeader();
  void OnHeader(boost::system::error_code ec);
  void ReadBody();
  void OnBody(boost::system::error_code ec);
  void Dispatch();
  // A response written from the I/O thread (an error, or Route's answer), then the next
  // request or, with `close`, a graceful close.
  void Respond(const HttpResponse& response, bool close);
  void RespondError(const absl::Status& status);
  void StartWatch();
  void OnWatch(boost::system::error_code ec, size_t n);
  void WriteNext();
  void OnWrite(boost::system::error_code ec, size_t n);
  void AfterExchange();
  void Linger();
  void Arm(absl::Duration timeout);
  void OnTimer(boost::system::error_code ec);
  void Close();
  void MarkGone();
  // Reserves this request's body against max_body_bytes_in_flight; false when over.
  bool ReserveBody();
  void ReleaseBody();

  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer timer_;
  const std::shared_ptr<ConnectionContext> context_;
  const HttpOptions& options_;
  std::string peer_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  HttpRequestHead head_;
  bool head_only_ = false;  // HEAD
  bool http10_ = false;
  bool keep_alive_ = true;
  bool routed_ = false;        // Route accepted the request: Refused reports a later failure
  int64_t body_reserved_ = 0;  // this request's share of ConnectionContext::body_bytes

  // Strand only.
  Phase phase_ = Phase::kIdle;
  bool timed_out_ = false;
  bool writing_ = false;
  bool watching_ = false;
  bool finishing_ = false;  // the exchange is over once the queue is written
  bool close_after_ = false;
  std::string in_flight_;  // the bytes of the write in progress

  // Shared with the handler thread.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  size_t queued_bytes_ = 0;  // queue_ + in_flight_
  std::atomic<bool> gone_{false};
};

}  // namespace glmserve
