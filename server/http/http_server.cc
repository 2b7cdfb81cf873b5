#include "server/http/http_server.h"

#include <malloc.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "server/http/http_connection.h"
#include "server/http/http_framing.h"
#include "server/http/openai_error.h"

namespace glmserve {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using ErrorCode = boost::system::error_code;

void ReturnLargeAllocationsToTheSystem() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kLargeAllocationBytes));
#endif
}

HttpResponse ErrorResponse(const absl::Status& status) {
  HttpError e = ToHttpError(status);
  HttpResponse r;
  r.status = e.status;
  r.body = std::move(e.body);
  return r;
}

HttpExchange::HttpExchange(std::shared_ptr<Connection> connection, bool head_only, bool http10,
                           bool close)
    : connection_(std::move(connection)), head_only_(head_only), http10_(http10), close_(close) {}

HttpExchange::~HttpExchange() = default;

void HttpExchange::Send(const HttpResponse& response) {
  status_ = response.status;
  std::string bytes =
      ResponseHead(response.status, response.content_type,
                   static_cast<int64_t>(response.body.size()), close_, http10_, response.headers);
  if (!head_only_) bytes += response.body;
  connection_->Queue(std::move(bytes));
}

void HttpExchange::SendJson(int status, const std::string& body) {
  HttpResponse r;
  r.status = status;
  r.body = body;
  Send(r);
}

void HttpExchange::SendError(const absl::Status& status) { Send(ErrorResponse(status)); }

bool HttpExchange::StartEventStream() {
  status_ = 200;
  // HTTP/1.0 has no chunked encoding: the stream ends when the connection does.
  return connection_->Queue(ResponseHead(200, "text/event-stream", -1, close_ || http10_, http10_,
                                         {{"Cache-Control", "no-cache"}}));
}

bool HttpExchange::SendEvent(const std::string& data) {
  const std::string event = absl::StrCat("data: ", data, "\n\n");
  return connection_->Queue(http10_ ? event : Chunk(event));
}

void HttpExchange::EndEventStream() {
  if (http10_) {
    must_close_ = true;
    return;
  }
  connection_->Queue(Chunk(""));
}

bool HttpExchange::PeerClosed() const { return connection_->gone(); }

std::string HttpExchange::peer() const { return connection_->peer(); }

// The listening socket, the I/O threads and the handler pool of one server.
class HttpServer::Core {
 public:
  explicit Core(const HttpOptions& options, HttpService* service)
      : context_(std::make_shared<ConnectionContext>()),
        ioc_(options.io_threads),
        work_(asio::make_work_guard(ioc_)),
        acceptor_(asio::make_strand(ioc_)),
        retry_(acceptor_.get_executor()) {
    context_->options = options;
    context_->service = service;
    // Each connection has at most one request in the pool; beyond this many waiting, new
    // ones are shed (429) rather than queued behind minutes of generations.
    context_->pool = std::make_unique<HandlerPool>(
        options.threads, static_cast<size_t>(std::max(64, 4 * options.threads)));
  }
  ~Core() { Stop(); }

  absl::Status Listen() {
    const HttpOptions& o = context_->options;
    ErrorCode ec;
    tcp::resolver resolver(ioc_);
    std::string host = o.address;  // "[::1]" as well as "::1"
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    const auto results = resolver.resolve(
        host, std::to_string(o.port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    const std::string where = absl::StrCat(o.address, ":", o.port);
    if (ec || results.empty()) {
      return absl::UnavailableError(absl::StrCat("cannot resolve ", where, ": ", ec.message()));
    }
    const tcp::endpoint endpoint = results.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve HTTP on ", where, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint(ec).port();
    Accept();
    for (int i = 0; i < o.io_threads; ++i) threads_.emplace_back([this] { ioc_.run(); });
    return absl::OkStatus();
  }

  void Stop() {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    asio::post(acceptor_.get_executor(), [this] {
      ErrorCode ignored;
      acceptor_.close(ignored);
      retry_.cancel();
    });
    ForEachConnection([](Connection& c) { c.CloseIfIdle(false); });
    context_->pool->Stop();  // the handlers in flight finish (a drain ended their requests)
    // Their responses get a moment to be written; connections between requests close.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (context_->open.load() > 0 && std::chrono::steady_clock::now() < deadline) {
      ForEachConnection([](Connection& c) { c.CloseIfIdle(false); });
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ForEachConnection([](Connection& c) { c.CloseIfIdle(true); });
    work_.reset();
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  int port() const { return port_; }
  int open() const { return context_->open.load(); }

 private:
  void Accept() {
    acceptor_.async_accept(asio::make_strand(ioc_), [this](ErrorCode ec, tcp::socket socket) {
      OnAccept(ec, std::move(socket));
    });
  }

  void OnAccept(ErrorCode ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors (EMFILE) or a transient failure: retry shortly, never spin.
      retry_.expires_after(std::chrono::milliseconds(100));
      retry_.async_wait([this](ErrorCode e) {
        if (!e && acceptor_.is_open()) Accept();
      });
      return;
    }
    if (context_->open.load() >= context_->options.max_connections) {
      Refuse(socket);
    } else {
      ErrorCode ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Connection>(std::move(socket), context_)->Start();
    }
    Accept();
  }

  // Over the connection bound: one 503 written without waiting, then closed.
  void Refuse(tcp::socket& socket) {
    static const std::string kResponse = [] {
      const HttpResponse r = ErrorResponse(WithHttpStatus(
          absl::UnavailableError("too many open connections to this server; retry later"), 503));
      return ResponseHead(503, r.content_type, static_cast<int64_t>(r.body.size()),
                          /*close=*/true, /*http10=*/false, {{"Retry-After", "1"}}) +
             r.body;
    }();
    ErrorCode ignored;
    socket.non_blocking(true, ignored);
    socket.write_some(asio::buffer(kResponse), ignored);
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  }

  template <typename F>
  void ForEachConnection(F f) {
    std::vector<std::shared_ptr<Connection>> live;
    {
      std::lock_guard<std::mutex> lock(context_->mu);
      for (auto& [raw, weak] : context_->live) {
        if (auto c = weak.lock()) live.push_back(std::move(c));
      }
    }
    for (auto& c : live) f(*c);
  }

  std::shared_ptr<ConnectionContext> context_;
  asio::io_context ioc_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  std::vector<std::thread> threads_;
  int port_ = -1;
  std::mutex stop_mu_;
  bool stopped_ = false;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpOptions& options,
                                                              HttpService* service) {
  auto core = std::make_shared<Core>(options, service);
  if (absl::Status s = core->Listen(); !s.ok()) return s;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(core)));
}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return core_->port(); }
int HttpServer::open_connections() const { return core_->open(); }
void HttpServer::Stop() { core_->Stop(); }

}  // namespace glmserve
