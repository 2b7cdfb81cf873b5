#include "server/http/http_connection.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/post.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/http/error.hpp"
#include "boost/beast/http/read.hpp"
#include "server/http/http_framing.h"
#include "server/http/openai_error.h"

namespace glmserve {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using ErrorCode = boost::system::error_code;

constexpr size_t kReadChunk = 16 << 10;
// A handler whose client reads slowly waits once this much of its response is queued.
constexpr size_t kMaxQueuedBytes = 256 << 10;
// How long, and for how many bytes, a connection closed after an error response keeps
// reading (and discarding) what its client still sends, so that the client reads the
// response instead of a reset.
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr size_t kLingerBytes = 1 << 20;

// After a request with a body this large, the allocator gives its free pages back: the
// copies of a 16 MiB body (read buffer, JSON string, rendered prompt) are allocated by
// glibc from the handler thread's arena once its mmap threshold has adapted upwards, and would
// otherwise stay resident per handler thread (50 refused 16 MiB bodies left +1.2 GB).
constexpr size_t kTrimAfterBytes = 1 << 20;

void ReleaseFreeMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

std::string PeerName(const tcp::socket& socket) {
  ErrorCode ec;
  const tcp::endpoint ep = socket.remote_endpoint(ec);
  if (ec) return "unknown";
  const asio::ip::address a = ep.address();
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    return absl::StrCat("ipv4:", a.to_v6().to_v4().to_string(), ":", ep.port());
  }
  return a.is_v4() ? absl::StrCat("ipv4:", a.to_string(), ":", ep.port())
                   : absl::StrCat("ipv6:[", a.to_string(), "]:", ep.port());
}

bool PeerWentAway(const ErrorCode& ec) {
  return ec == http::error::end_of_stream || ec == http::error::partial_message ||
         ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::operation_aborted || ec == asio::error::broken_pipe;
}

absl::Status Timeout(absl::string_view what, absl::Duration limit) {
  return WithHttpStatus(absl::DeadlineExceededError(absl::StrCat(what, " did not arrive within ",
                                                                 absl::FormatDuration(limit))),
                        408);
}

}  // namespace

Connection::Connection(tcp::socket socket, std::shared_ptr<ConnectionContext> context)
    : socket_(std::move(socket)),
      timer_(socket_.get_executor()),
      context_(std::move(context)),
      options_(context_->options),
      peer_(PeerName(socket_)),
      buffer_(static_cast<size_t>(options_.max_header_bytes) + 2 * kReadChunk) {
  context_->open.fetch_add(1);
}

Connection::~Connection() {
  ReleaseBody();
  {
    std::lock_guard<std::mutex> lock(context_->mu);
    context_->live.erase(this);
  }
  context_->open.fetch_sub(1);
}

void Connection::Start() {
  {
    std::lock_guard<std::mutex> lock(context_->mu);
    context_->live.emplace(this, weak_from_this());
  }
  asio::post(socket_.get_executor(), [self = shared_from_this()] { self->ReadRequest(); });
}

void Connection::ReadRequest() {
  ReleaseBody();
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(options_.max_header_bytes));
  parser_->body_limit(static_cast<uint64_t>(options_.max_body_bytes));
  routed_ = false;
  head_only_ = false;
  http10_ = false;
  keep_alive_ = true;
  timed_out_ = false;
  finishing_ = false;
  close_after_ = false;
  if (buffer_.size() > 0) {  // a pipelined request is already here
    ReadHeader();
    return;
  }
  // Idle: nothing is spent on a connection until its client sends a byte.
  phase_ = Phase::kIdle;
  Arm(options_.idle_timeout);
  socket_.async_read_some(buffer_.prepare(kReadChunk),
                          [self = shared_from_this()](ErrorCode ec, size_t n) {
                            if (self->phase_ == Phase::kClosed) return;
                            if (ec || self->timed_out_) {
                              self->Close();
                              return;
                            }
                            self->buffer_.commit(n);
                            self->ReadHeader();
                          });
}

void Connection::ReadHeader() {
  phase_ = Phase::kHeader;
  Arm(options_.header_timeout);
  http::async_read_header(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](ErrorCode ec, size_t) { self->OnHeader(ec); });
}

void Connection::OnHeader(ErrorCode ec) {
  if (phase_ == Phase::kClosed) return;
  if (timed_out_) {
    RespondError(Timeout("the request's header", options_.header_timeout));
    return;
  }
  if (ec && PeerWentAway(ec)) {
    Close();
    return;
  }
  if (ec) {
    RespondError(ParserError(ec, options_.max_header_bytes, options_.max_body_bytes));
    return;
  }
  const http::request<http::string_body>& req = parser_->get();
  http10_ = req.version() == 10;
  head_only_ = req.method() == http::verb::head;
  keep_alive_ = req.keep_alive();
  absl::StatusOr<CheckedHead> checked = CheckRequestHead(req, options_.max_header_fields);
  if (!checked.ok()) {
    RespondError(checked.status());
    return;
  }
  head_.method = std::string(req.method_string());
  head_.path = checked->path;
  const auto auth = req.find(http::field::authorization);
  head_.authorization =
      auth == req.end() ? std::string() : std::string(auth->value().data(), auth->value().size());
  head_.peer = peer_;
  head_.arrival = std::chrono::steady_clock::now();
  // A request whose body is not read (answered from its head) ends the connection: its bytes
  // are never taken for a next request.
  const bool unread_body = !parser_->is_done();
  if (checked->asterisk) {
    HttpResponse allow{200, "", "", {{"Allow", "GET, HEAD, POST, OPTIONS"}}};
    Respond(allow, unread_body);
    return;
  }
  if (std::optional<HttpResponse> answer = context_->service->Route(head_)) {
    Respond(*answer, unread_body);
    return;
  }
  routed_ = true;
  if (!unread_body) {
    Dispatch();
    return;
  }
  if (!ReserveBody()) {
    RespondError(absl::ResourceExhaustedError(
        absl::StrCat("request bodies in flight are over the server's budget of ",
                     options_.max_body_bytes_in_flight, " bytes; retry later")));
    return;
  }
  phase_ = Phase::kBody;
  Arm(options_.body_timeout);
  if (!checked->expect_continue) {
    ReadBody();
    return;
  }
  static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
  asio::async_write(socket_, asio::buffer(kContinue),
                    [self = shared_from_this()](ErrorCode ec, size_t) {
                      if (self->phase_ == Phase::kClosed) return;
                      if (ec) {
                        self->Close();
                        return;
                      }
                      self->ReadBody();
                    });
}

void Connection::ReadBody() {
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this()](ErrorCode ec, size_t) { self->OnBody(ec); });
}

void Connection::OnBody(ErrorCode ec) {
  if (phase_ == Phase::kClosed) return;
  if (timed_out_) {
    RespondError(Timeout("the whole request body", options_.body_timeout));
    return;
  }
  if (ec && PeerWentAway(ec)) {
    context_->service->Refused(head_, absl::CancelledError("the client disconnected"));
    Close();
    return;
  }
  if (ec) {
    RespondError(ParserError(ec, options_.max_header_bytes, options_.max_body_bytes));
    return;
  }
  Dispatch();
}

void Connection::Dispatch() {
  timer_.cancel();
  phase_ = Phase::kServing;
  finishing_ = false;
  close_after_ = !keep_alive_;
  std::string body = std::move(parser_->get().body());
  parser_->get().body() = std::string();
  auto self = shared_from_this();
  // Mutable: the body moves on into Serve (a const capture would be copied, and kept until
  // the job is destroyed). Its reservation goes with it and ends when Serve is done.
  const int64_t reserved = std::exchange(body_reserved_, 0);
  const bool submitted =
      context_->pool->Submit([self, head = head_, body = std::move(body), head_only = head_only_,
                              http10 = http10_, close = close_after_, reserved]() mutable {
        HttpExchange exchange(self, head_only, http10, close);
        const size_t body_bytes = body.size();
        self->context_->service->Serve(head, std::move(body), exchange);
        self->context_->body_bytes.fetch_sub(reserved);
        if (body_bytes >= kTrimAfterBytes) ReleaseFreeMemory();
        if (exchange.http_status() == 0) {
          exchange.SendError(absl::InternalError("the handler sent no response"));
        }
        self->Finish(exchange.must_close());
      });
  if (!submitted) {
    context_->body_bytes.fetch_sub(reserved);
    RespondError(absl::ResourceExhaustedError(
        absl::StrCat("too many HTTP requests waiting for a handler (", options_.threads,
                     " handler threads); retry later")));
    return;
  }
  StartWatch();
}

void Connection::Respond(const HttpResponse& response, bool close) {
  timer_.cancel();
  phase_ = Phase::kServing;
  finishing_ = true;
  close_after_ = close || !keep_alive_;
  std::string bytes = ResponseHead(response.status, response.content_type,
                                   static_cast<int64_t>(response.body.size()), close_after_,
                                   http10_, response.headers);
  if (!head_only_) bytes += response.body;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_bytes_ += bytes.size();
    queue_.push_back(std::move(bytes));
  }
  WriteNext();
}

void Connection::RespondError(const absl::Status& status) {
  ReleaseBody();
  if (routed_) {
    routed_ = false;
    context_->service->Refused(head_, status);
  }
  Respond(ErrorResponse(status), /*close=*/true);
}

bool Connection::Queue(std::string bytes) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return gone_.load() || queued_bytes_ < kMaxQueuedBytes; });
    if (gone_.load()) return false;
    queued_bytes_ += bytes.size();
    queue_.push_back(std::move(bytes));
  }
  asio::post(socket_.get_executor(), [self = shared_from_this()] { self->WriteNext(); });
  return true;
}

void Connection::Finish(bool close) {
  asio::post(socket_.get_executor(), [self = shared_from_this(), close] {
    if (self->phase_ != Phase::kServing || self->finishing_) return;
    self->finishing_ = true;
    self->close_after_ |= close;
    bool idle;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      idle = self->queue_.empty();
    }
    if (idle && !self->writing_) self->AfterExchange();
  });
}

// While a handler runs, the connection keeps reading (into the buffer, for the next
// request): that is how a client that leaves is noticed at once, streaming or not.
void Connection::StartWatch() {
  if (watching_ || phase_ != Phase::kServing || gone_.load()) return;
  if (buffer_.size() + kReadChunk > buffer_.max_size()) return;  // pipelined bytes wait
  watching_ = true;
  socket_.async_read_some(
      buffer_.prepare(kReadChunk),
      [self = shared_from_this()](ErrorCode ec, size_t n) { self->OnWatch(ec, n); });
}

void Connection::OnWatch(ErrorCode ec, size_t n) {
  watching_ = false;
  if (phase_ == Phase::kClosed) return;
  if (!ec) buffer_.commit(n);
  if (ec && ec != asio::error::operation_aborted) {
    // The client closed (or half-closed) its side: gone, whatever is still to be written.
    MarkGone();
    if (!writing_) Close();
    return;
  }
  if (finishing_ && !writing_) {
    AfterExchange();
    return;
  }
  StartWatch();
}

void Connection::WriteNext() {
  if (writing_ || phase_ == Phase::kClosed) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) return;
    in_flight_ = std::move(queue_.front());
    queue_.pop_front();
  }
  writing_ = true;
  // A write that makes no progress for this long: the client is not reading.
  Arm(options_.idle_timeout);
  asio::async_write(socket_, asio::buffer(in_flight_),
                    [self = shared_from_this()](ErrorCode ec, size_t n) { self->OnWrite(ec, n); });
}

void Connection::OnWrite(ErrorCode ec, size_t) {
  writing_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_bytes_ -= in_flight_.size();
  }
  in_flight_ = std::string();
  cv_.notify_all();
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    MarkGone();
    Close();
    return;
  }
  bool more;
  {
    std::lock_guard<std::mutex> lock(mu_);
    more = !queue_.empty();
  }
  if (more) {
    WriteNext();
    return;
  }
  timer_.cancel();
  if (finishing_) AfterExchange();
}

void Connection::AfterExchange() {
  if (phase_ == Phase::kClosed) return;
  if (gone_.load()) {
    Close();
    return;
  }
  if (close_after_) {
    Linger();
    return;
  }
  if (watching_) {
    // The watch read ends (OnWatch) and comes back here.
    ErrorCode ignored;
    socket_.cancel(ignored);
    return;
  }
  ReadRequest();
}

void Connection::Linger() {
  phase_ = Phase::kLinger;
  ErrorCode ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  timer_.expires_after(kLingerTime);
  timer_.async_wait([self = shared_from_this()](ErrorCode ec) { self->OnTimer(ec); });
  buffer_.consume(buffer_.size());
  struct Discard {
    std::shared_ptr<Connection> self;
    size_t total = 0;
    void operator()(ErrorCode ec, size_t n) {
      total += n;
      if (ec || total > kLingerBytes || self->phase_ == Phase::kClosed) {
        self->Close();
        return;
      }
      self->socket_.async_read_some(self->buffer_.prepare(kReadChunk), std::move(*this));
    }
  };
  socket_.async_read_some(buffer_.prepare(kReadChunk), Discard{shared_from_this()});
}

void Connection::Arm(absl::Duration timeout) {
  timer_.expires_after(absl::ToChronoNanoseconds(timeout));
  timer_.async_wait([self = shared_from_this()](ErrorCode ec) { self->OnTimer(ec); });
}

void Connection::OnTimer(ErrorCode ec) {
  if (ec == asio::error::operation_aborted || phase_ == Phase::kClosed) return;
  if (timer_.expiry() > std::chrono::steady_clock::now()) return;  // re-armed since
  switch (phase_) {
    case Phase::kHeader:
    case Phase::kBody: {
      // The read in progress ends with operation_aborted; OnHeader / OnBody answer 408.
      timed_out_ = true;
      ErrorCode ignored;
      socket_.cancel(ignored);
      return;
    }
    case Phase::kIdle:
    case Phase::kServing:
    case Phase::kLinger:
      timed_out_ = true;
      Close();
      return;
    case Phase::kClosed:
      return;
  }
}

void Connection::MarkGone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone_.store(true);
  }
  cv_.notify_all();
}

bool Connection::ReserveBody() {
  const auto length = parser_->content_length();
  const int64_t need = length ? static_cast<int64_t>(*length) : options_.max_body_bytes;
  if (context_->body_bytes.fetch_add(need) + need > options_.max_body_bytes_in_flight) {
    context_->body_bytes.fetch_sub(need);
    return false;
  }
  body_reserved_ = need;
  return true;
}

void Connection::ReleaseBody() {
  if (body_reserved_ == 0) return;
  context_->body_bytes.fetch_sub(body_reserved_);
  body_reserved_ = 0;
}

void Connection::Close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  ReleaseBody();
  MarkGone();
  timer_.cancel();
  ErrorCode ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

void Connection::CloseIfIdle(bool all) {
  asio::post(socket_.get_executor(), [self = shared_from_this(), all] {
    const Phase p = self->phase_;
    if (all || p == Phase::kIdle || p == Phase::kHeader || p == Phase::kBody ||
        p == Phase::kLinger) {
      self->Close();
    }
  });
}

}  // namespace glmserve
