// The connection layer of `qspec serve` (see http_front.h): admission, the header collector,
// the worker pool, per-request deadlines and caps, TLS, and the bounded drain.
#include "server/http_front.h"

#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "qspec/error.h"

namespace qspec {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Milliseconds from now until `deadline`, for poll(): at least 0, at most `cap_ms`.
int ms_until(Clock::time_point deadline, int cap_ms = 1000) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, cap_ms));
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Why the current request's read failed (read by the routes to pick 408 / 431).
enum class ReadFailure { none, timeout, head_too_large, shutting_down };

// What one request being served knows about itself (thread-local while it is served).
struct RequestState {
  bool head_done = false;     // the pre-routing guard ran: reads from now on are the body
  size_t head_bytes = 0;      // bytes read before that (TLS and serve_bytes; the collector caps plain heads)
  ReadFailure failure = ReadFailure::none;
  bool close_after = false;
};
thread_local RequestState* t_request = nullptr;

void remote_endpoint(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ip.clear();
  port = 0;
  if ((peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
            : getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len)) != 0)
    return;
  char host[64] = {};
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  ip = host;
}

// The reason phrases of the answers this layer writes itself.
const char* reason_phrase(int status) {
  switch (status) {
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string openssl_error() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "unknown OpenSSL error";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

}  // namespace

// One client connection.
struct Connection {
  int fd = -1;
  SSL* ssl = nullptr;
  std::string in;      // received and not yet consumed by the request parser
  size_t in_pos = 0;
  Clock::time_point deadline;   // the current request's (or the idle connection's)
  bool head_started = false;    // bytes of the current request have arrived
  bool refuse = false;          // over max_connections: answered 503 once its head is in
  size_t served = 0;
  size_t pending() const { return in.size() - in_pos; }
  void compact() {
    if (in_pos > 0) in.erase(0, in_pos), in_pos = 0;
  }
};

struct HttpFront::Impl {
  HttpFront& front;
  HttpLimits limits;
  SSL_CTX* tls = nullptr;
  HandlerWithResponse guard;
  std::function<void()> on_drain_timeout;

  std::atomic<int64_t> accepted{0}, refused{0}, timeouts{0}, heads_too_large{0}, tls_failures{0}, open{0};
  std::atomic<int> refusing{0};
  static constexpr int kMaxRefusing = 64;  // 503 answers pending at once; beyond, a plain close

  // The collector's inbox and the workers' queue.
  std::mutex mutex;
  std::condition_variable work_ready, idle;
  std::vector<std::unique_ptr<Connection>> inbox;
  std::deque<std::unique_ptr<Connection>> ready;
  std::set<int> in_flight;   // fds a worker serves now (cut at the drain's end)
  int busy = 0;
  std::atomic<bool> stopping{false};  // read by streams and lingering closes without the lock
  bool workers_stop = false;
  int wake_pipe[2] = {-1, -1};
  std::thread collector;
  std::vector<std::thread> workers;

  Impl(HttpFront& f, HttpLimits l) : front(f), limits(l) {}

  // ---- responses written by the connection layer itself (no route ran) ----
  static void write_all_nowait(int fd, const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

  std::string canned(int status, const std::string& message, const std::string& code) const {
    const std::string body = front_error_body ? front_error_body(status, message, code) : message;
    return "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) +
           "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n\r\n" + body;
  }
  std::function<std::string(int, const std::string&, const std::string&)> front_error_body;

  void close_connection(std::unique_ptr<Connection> c) {
    if (!c) return;
    if (c->ssl) {
      SSL_shutdown(c->ssl);
      SSL_free(c->ssl);
    }
    ::shutdown(c->fd, SHUT_RDWR);
    ::close(c->fd);
    if (c->refuse) --refusing;
    --open;
  }

  // Closes after an answer that left part of the request unread: the client may still be
  // sending it and reads the answer only then, so what it sends is read and dropped for a
  // moment first (a plain close would reset the connection and lose the answer).
  void linger_close(std::unique_ptr<Connection> c) {
    if (!c) return;
    if (!c->ssl) {
      ::shutdown(c->fd, SHUT_WR);
      const auto until = Clock::now() + std::chrono::seconds(2);
      char sink[16384];
      for (;;) {
        pollfd p{c->fd, POLLIN, 0};
        if (stopping || ::poll(&p, 1, ms_until(until, 100)) < 0 || Clock::now() >= until) break;
        if (p.revents == 0) continue;
        const ssize_t n = ::recv(c->fd, sink, sizeof sink, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
      }
    }
    close_connection(std::move(c));
  }

  void answer_and_close(std::unique_ptr<Connection> c, int status, const std::string& message,
                        const std::string& code) {
    write_all_nowait(c->fd, canned(status, message, code));
    ::shutdown(c->fd, SHUT_WR);
    char sink[16384];  // what already arrived (bounded: this runs on the collector's thread)
    for (int i = 0; i < 64 && ::recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
    }
    close_connection(std::move(c));
  }

  // ---- admission (on the accept thread; must not block) ----
  void admit(int fd) {
    set_nonblocking(fd);
    ++accepted;
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->deadline = Clock::now() + seconds(limits.request_timeout_seconds);
    const int64_t now_open = ++open;
    if (now_open > limits.max_connections) {
      ++refused;
      if (tls || refusing >= kMaxRefusing) {  // no plain-text answer on TLS; bounded refusals in flight
        close_connection(std::move(c));
        return;
      }
      c->refuse = true;  // answered 503 by the collector once its head is in (or after 2 s)
      ++refusing;
      c->deadline = Clock::now() + std::min(seconds(2), seconds(limits.request_timeout_seconds));
    }
    std::lock_guard lock(mutex);
    if (stopping) {
      close_connection(std::move(c));
      return;
    }
    if (tls) {
      ready.push_back(std::move(c));
      work_ready.notify_one();
    } else {
      inbox.push_back(std::move(c));
      wake();
    }
  }

  void wake() {
    const char byte = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_pipe[1], &byte, 1);
  }

  // ---- the collector: plain connections wait here until a request head is complete ----
  static bool head_complete(const Connection& c) {
    return c.in.find("\r\n\r\n", c.in_pos) != std::string::npos;
  }

  // Reads what the socket has (at most the head cap plus a little). false: closed or failed.
  bool fill(Connection& c) {
    char buffer[16384];
    while (c.pending() <= limits.max_header_bytes) {
      const ssize_t n = ::recv(c.fd, buffer, sizeof buffer, 0);
      if (n > 0) {
        c.in.append(buffer, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    return true;
  }

  // A connection in the collector has news: dispatch it, answer it or keep it. Returns the
  // connection when it stays.
  std::unique_ptr<Connection> settle(std::unique_ptr<Connection> c, Clock::time_point now) {
    if (!c->head_started && c->pending() > 0) {  // the request's deadline runs from its first byte
      c->head_started = true;
      if (!c->refuse) c->deadline = now + seconds(limits.request_timeout_seconds);
    }
    if (head_complete(*c)) {
      if (c->refuse) {
        answer_and_close(std::move(c), 503, "too many connections: the server is at --max-connections",
                         "too_many_connections");
        return nullptr;
      }
      std::lock_guard lock(mutex);
      ready.push_back(std::move(c));
      work_ready.notify_one();
      return nullptr;
    }
    if (c->pending() > limits.max_header_bytes) {
      ++heads_too_large;
      answer_and_close(std::move(c), 431,
                       "the request line and headers are larger than " + std::to_string(limits.max_header_bytes) +
                           " bytes",
                       "header_too_large");
      return nullptr;
    }
    if (now >= c->deadline) {
      if (c->refuse) {
        answer_and_close(std::move(c), 503, "too many connections: the server is at --max-connections",
                         "too_many_connections");
      } else if (c->head_started) {
        ++timeouts;
        answer_and_close(std::move(c), 408, "the request was not received within the request timeout",
                         "request_timeout");
      } else {
        close_connection(std::move(c));  // an idle keep-alive connection
      }
      return nullptr;
    }
    return c;
  }

  void collector_loop() {
    std::vector<std::unique_ptr<Connection>> waiting;
    std::vector<pollfd> fds;
    for (;;) {
      bool stop = false;
      {
        std::lock_guard lock(mutex);
        for (auto& c : inbox) waiting.push_back(std::move(c));
        inbox.clear();
        stop = stopping;
      }
      if (stop) {  // idle connections have no request in flight: close them now
        for (auto& c : waiting) close_connection(std::move(c));
        return;
      }
      // Connections handed back with a complete pipelined head go on at once.
      const auto now = Clock::now();
      std::vector<std::unique_ptr<Connection>> kept;
      for (auto& c : waiting)
        if (auto k = settle(std::move(c), now)) kept.push_back(std::move(k));
      waiting.swap(kept);

      fds.assign(1, pollfd{wake_pipe[0], POLLIN, 0});
      Clock::time_point next = Clock::now() + std::chrono::seconds(1);
      for (auto& c : waiting) {
        fds.push_back(pollfd{c->fd, POLLIN, 0});
        next = std::min(next, c->deadline);
      }
      const int ready_count = ::poll(fds.data(), fds.size(), ms_until(next) + 1);
      if (ready_count < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (fds[0].revents & POLLIN) {
        char sink[256];
        while (::read(wake_pipe[0], sink, sizeof sink) > 0) {
        }
      }
      const auto after = Clock::now();
      kept.clear();
      for (size_t i = 0; i < waiting.size(); ++i) {
        auto& c = waiting[i];
        if (fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) {
          if (!fill(*c) && !head_complete(*c)) {
            close_connection(std::move(c));
            continue;
          }
        }
        if (auto k = settle(std::move(c), after)) kept.push_back(std::move(k));
      }
      waiting.swap(kept);
    }
  }

  // ---- workers ----
  void worker_loop() {
    for (;;) {
      std::unique_ptr<Connection> c;
      {
        std::unique_lock lock(mutex);
        work_ready.wait(lock, [&] { return workers_stop || !ready.empty(); });
        if (ready.empty()) return;
        c = std::move(ready.front());
        ready.pop_front();
        ++busy;
        in_flight.insert(c->fd);
      }
      const int fd = c->fd;
      if (tls)
        c = serve_tls(std::move(c));
      else
        c = serve_plain(std::move(c));
      {
        std::lock_guard lock(mutex);
        in_flight.erase(fd);
        if (c && !stopping) {
          inbox.push_back(std::move(c));
          wake();
        }
        --busy;
      }
      if (c) close_connection(std::move(c));  // stopping: not back to the collector
      idle.notify_all();
    }
  }

  // Serves one request whose head is in c->in; returns the connection when it stays open.
  std::unique_ptr<Connection> serve_plain(std::unique_ptr<Connection> c);
  // Serves a TLS connection to its end (handshake, then requests).
  std::unique_ptr<Connection> serve_tls(std::unique_ptr<Connection> c);
  // One request over `stream`; false: close the connection.
  bool serve_request(httplib::Stream& stream, Connection& c);

  // ---- start and drain (httplib's task queue: start at listen, shutdown at its end) ----
  void start() {
    std::lock_guard lock(mutex);
    stopping = false;
    workers_stop = false;
    if (wake_pipe[0] < 0) {
      QSPEC_CHECK(::pipe(wake_pipe) == 0, "serve: cannot create a pipe");
      for (int fd : wake_pipe) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
    }
    collector = std::thread([this] { collector_loop(); });
    for (int i = 0; i < std::max(limits.worker_threads, 1); ++i) workers.emplace_back([this] { worker_loop(); });
  }

  void drain() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
      wake();
    }
    if (collector.joinable()) collector.join();
    std::unique_lock lock(mutex);
    auto quiet = [&] { return busy == 0 && ready.empty(); };
    if (!idle.wait_for(lock, seconds(limits.drain_timeout_seconds), quiet)) {
      std::fprintf(stderr, "[qspec] drain: %d requests still in flight after %.0f s, cancelling them\n", busy,
                   limits.drain_timeout_seconds);
      lock.unlock();
      if (on_drain_timeout) on_drain_timeout();
      lock.lock();
      if (!idle.wait_for(lock, std::chrono::seconds(5), quiet))
        for (int fd : in_flight) ::shutdown(fd, SHUT_RDWR);  // clients that do not read
    }
    workers_stop = true;
    work_ready.notify_all();
    lock.unlock();
    for (auto& w : workers) w.join();
    workers.clear();
    lock.lock();
    for (auto& c : ready) close_connection(std::move(c));
    ready.clear();
    for (auto& c : inbox) close_connection(std::move(c));
    inbox.clear();
  }
};

namespace {

// The httplib stream over one connection: buffered reads under the request's deadline, writes
// under the write timeout; plain or TLS.
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(Connection& c, const HttpLimits& limits, const std::atomic<bool>& stopping)
      : c_(c), limits_(limits), stopping_(stopping) {}

  bool is_readable() const override { return c_.pending() > 0 || (c_.ssl && SSL_pending(c_.ssl) > 0); }
  bool is_writable() const override {
    pollfd p{c_.fd, POLLOUT, 0};
    return ::poll(&p, 1, 0) > 0 && !(p.revents & (POLLERR | POLLHUP));
  }

  ssize_t read(char* ptr, size_t size) override {
    if (c_.pending() == 0 && !refill()) return -1;
    size_t n = std::min(size, c_.pending());
    RequestState& state = this->state();
    if (!state.head_done && c_.ssl) {  // a TLS head is capped here (the collector caps plain ones)
      if (state.head_bytes + n > limits_.max_header_bytes) {
        state.failure = ReadFailure::head_too_large;
        return -1;
      }
      state.head_bytes += n;
    }
    std::memcpy(ptr, c_.in.data() + c_.in_pos, n);
    c_.in_pos += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    const auto deadline = Clock::now() + seconds(limits_.write_timeout_seconds);
    size_t done = 0;
    while (done < size) {
      ssize_t n;
      if (c_.ssl) {
        n = SSL_write(c_.ssl, ptr + done, static_cast<int>(std::min<size_t>(size - done, 1 << 20)));
        if (n <= 0) {
          const int err = SSL_get_error(c_.ssl, static_cast<int>(n));
          if (err != SSL_ERROR_WANT_WRITE && err != SSL_ERROR_WANT_READ) return -1;
          if (!wait(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) return -1;
          continue;
        }
      } else {
        n = ::send(c_.fd, ptr + done, size - done, MSG_NOSIGNAL);
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
          if (!wait(POLLOUT, deadline)) return -1;
          continue;
        }
      }
      done += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { remote_endpoint(c_.fd, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { remote_endpoint(c_.fd, false, ip, port); }
  // httplib only reads this to refuse descriptors beyond select()'s FD_SETSIZE with a 500;
  // this stream polls, so any descriptor is fine.
  socket_t socket() const override { return c_.fd < FD_SETSIZE ? c_.fd : 0; }

 private:
  bool wait(short events, Clock::time_point deadline) {
    for (;;) {
      if (Clock::now() >= deadline) return false;
      pollfd p{c_.fd, events, 0};
      const int r = ::poll(&p, 1, ms_until(deadline));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) return false;
    }
  }

  // Reads more into the connection's buffer before the request's deadline.
  bool refill() {
    c_.compact();
    char buffer[16384];
    for (;;) {
      ssize_t n;
      if (c_.ssl) {
        n = SSL_read(c_.ssl, buffer, sizeof buffer);
        if (n <= 0) {
          const int err = SSL_get_error(c_.ssl, static_cast<int>(n));
          if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) return false;
          if (!wait_deadline(err == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN)) return false;
          continue;
        }
      } else {
        n = ::recv(c_.fd, buffer, sizeof buffer, 0);
        if (n == 0) return false;
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
          if (!wait_deadline(POLLIN)) return false;
          continue;
        }
      }
      c_.in.append(buffer, static_cast<size_t>(n));
      return true;
    }
  }

  // Waits to read more of the request: until its deadline, or until shutdown (a request
  // still arriving then is not served).
  bool wait_deadline(short events) {
    for (;;) {
      if (stopping_) {
        state().failure = ReadFailure::shutting_down;
        return false;
      }
      const auto slice = std::min(c_.deadline, Clock::now() + std::chrono::milliseconds(100));
      if (wait(events, slice)) return true;
      if (Clock::now() >= c_.deadline) {
        state().failure = ReadFailure::timeout;
        return false;
      }
    }
  }

  // The request being read (serve_request sets it for this thread).
  static RequestState& state() {
    static thread_local RequestState none;
    return t_request ? *t_request : none;
  }

  Connection& c_;
  const HttpLimits& limits_;
  const std::atomic<bool>& stopping_;
};

// serve_bytes' stream: reads from a buffer, writes to a string.
class MemoryStream : public httplib::Stream {
 public:
  MemoryStream(std::string_view input, std::string& output, const HttpLimits& limits, RequestState*& state)
      : input_(input), output_(output), limits_(limits), state_(state) {}
  bool is_readable() const override { return pos_ < input_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ >= input_.size()) return -1;
    const size_t n = std::min(size, input_.size() - pos_);
    if (state_ && !state_->head_done) {
      if (state_->head_bytes + n > limits_.max_header_bytes) {
        state_->failure = ReadFailure::head_too_large;
        return -1;
      }
      state_->head_bytes += n;
    }
    std::memcpy(ptr, input_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    output_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { ip = "127.0.0.1", port = 1; }
  void get_local_ip_and_port(std::string& ip, int& port) const override { ip = "127.0.0.1", port = 2; }
  socket_t socket() const override { return 0; }
  bool consumed() const { return pos_ >= input_.size(); }

 private:
  std::string_view input_;
  std::string& output_;
  const HttpLimits& limits_;
  RequestState*& state_;
  size_t pos_ = 0;
};

// httplib's task queue, turned into our admission: the accept thread hands each socket here.
class AdmissionQueue : public httplib::TaskQueue {
 public:
  explicit AdmissionQueue(HttpFront::Impl& impl) : impl_(impl) { impl_.start(); }
  void enqueue(std::function<void()> fn) override { fn(); }  // -> process_and_close_socket -> admit
  void shutdown() override { impl_.drain(); }

 private:
  HttpFront::Impl& impl_;
};

}  // namespace

bool HttpFront::Impl::serve_request(httplib::Stream& stream, Connection& c) {
  RequestState state;
  t_request = &state;
  const bool last = stopping || c.served + 1 >= limits.max_requests_per_connection;
  bool closed = false;
  bool ok = false;
  try {
    ok = front.serve_one(stream, last, closed);
  } catch (...) {  // the routes catch their own; this is the last line
    ok = false;
  }
  t_request = nullptr;
  ++c.served;
  if (state.failure == ReadFailure::timeout) ++timeouts;
  if (state.failure == ReadFailure::head_too_large) ++heads_too_large;
  return ok && !closed && !last && !state.close_after && state.failure == ReadFailure::none;
}

std::unique_ptr<Connection> HttpFront::Impl::serve_plain(std::unique_ptr<Connection> c) {
  ConnectionStream stream(*c, limits, stopping);
  if (!serve_request(stream, *c)) {
    linger_close(std::move(c));
    return nullptr;
  }
  // Back to the collector: idle until the next request, or at once when it is already in.
  c->compact();
  const auto now = Clock::now();
  c->head_started = false;
  c->deadline = now + seconds(limits.keep_alive_seconds);
  return c;
}

std::unique_ptr<Connection> HttpFront::Impl::serve_tls(std::unique_ptr<Connection> c) {
  c->ssl = SSL_new(tls);
  if (!c->ssl || SSL_set_fd(c->ssl, c->fd) != 1) {
    ++tls_failures;
    close_connection(std::move(c));
    return nullptr;
  }
  for (;;) {  // the handshake, under the request deadline
    ERR_clear_error();
    const int r = SSL_accept(c->ssl);
    if (r == 1) break;
    const int err = SSL_get_error(c->ssl, r);
    pollfd p{c->fd, static_cast<short>(err == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN), 0};
    if ((err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) || Clock::now() >= c->deadline ||
        ::poll(&p, 1, ms_until(c->deadline)) < 0 || stopping) {
      ++tls_failures;
      close_connection(std::move(c));
      return nullptr;
    }
  }
  for (;;) {
    ConnectionStream stream(*c, limits, stopping);
    if (!serve_request(stream, *c)) break;
    // Idle until the next request's first bytes, then its deadline runs.
    c->compact();
    const auto idle_deadline = Clock::now() + seconds(limits.keep_alive_seconds);
    bool more = c->pending() > 0 || SSL_pending(c->ssl) > 0;
    while (!more && !stopping && Clock::now() < idle_deadline) {
      pollfd p{c->fd, POLLIN, 0};
      const int r = ::poll(&p, 1, ms_until(idle_deadline, 200));
      if (r > 0) more = true;
    }
    if (!more || stopping) break;
    c->deadline = Clock::now() + seconds(limits.request_timeout_seconds);
  }
  close_connection(std::move(c));
  return nullptr;
}

HttpFront::HttpFront(HttpLimits limits, const std::optional<TlsFiles>& tls)
    : impl_(std::make_unique<Impl>(*this, limits)) {
  if (tls) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    QSPEC_CHECK(ctx != nullptr, "serve: cannot create a TLS context: ", openssl_error());
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    auto fail_with = [&](const std::string& what) {
      const std::string reason = openssl_error();
      SSL_CTX_free(ctx);
      fail(what, ": ", reason);
    };
    if (SSL_CTX_use_certificate_chain_file(ctx, tls->cert_file.c_str()) != 1)
      fail_with("--ssl-certfile " + tls->cert_file + ": cannot load the certificate (PEM)");
    if (SSL_CTX_use_PrivateKey_file(ctx, tls->key_file.c_str(), SSL_FILETYPE_PEM) != 1)
      fail_with("--ssl-keyfile " + tls->key_file + ": cannot load the private key (PEM)");
    if (SSL_CTX_check_private_key(ctx) != 1)
      fail_with("--ssl-keyfile " + tls->key_file + ": the key does not match --ssl-certfile " + tls->cert_file);
    impl_->tls = ctx;
  }
  new_task_queue = [this] { return new AdmissionQueue(*impl_); };
  // httplib writes these into every kept-alive answer's Keep-Alive header; the connections are
  // ours (Impl), so they say our limits, not httplib's defaults (5 requests, 5 s).
  set_keep_alive_max_count(limits.max_requests_per_connection);
  set_keep_alive_timeout(static_cast<time_t>(std::max(1.0, std::ceil(limits.keep_alive_seconds))));
  set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (t_request) t_request->head_done = true;
    // httplib adds REMOTE_ADDR, REMOTE_PORT, LOCAL_ADDR and LOCAL_PORT to the client's headers.
    if (req.headers.size() > impl_->limits.max_header_count + 4) {
      ++impl_->heads_too_large;
      res.status = 431;
      close_after_response(res);
      return HandlerResponse::Handled;
    }
    // A declared body over the cap is refused before a byte of it is read (httplib would read
    // it all to discard it). No Content-Length reads as 0.
    const unsigned long long declared_length = std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10);
    if (declared_length > payload_max_length_) {
      res.status = 413;
      close_after_response(res);
      return HandlerResponse::Handled;
    }
    if (!impl_->guard) return HandlerResponse::Unhandled;
    const HandlerResponse answered = impl_->guard(req, res);
    // Answered before its body was read (a 401, a CORS preflight): what the client sent of the
    // body stays unread, so the connection closes after the answer.
    const bool declares_body = req.has_header("Transfer-Encoding") || declared_length > 0;
    if (answered == HandlerResponse::Handled && declares_body) close_after_response(res);
    return answered;
  });
}

HttpFront::~HttpFront() {
  if (impl_->tls) SSL_CTX_free(impl_->tls);
  for (int fd : impl_->wake_pipe)
    if (fd >= 0) ::close(fd);
}

const HttpLimits& HttpFront::limits() const { return impl_->limits; }

HttpFrontStats HttpFront::stats() const {
  HttpFrontStats s;
  s.connections_accepted = impl_->accepted;
  s.connections_refused = impl_->refused;
  s.request_timeouts = impl_->timeouts;
  s.heads_too_large = impl_->heads_too_large;
  s.tls_handshake_failures = impl_->tls_failures;
  s.connections_open = impl_->open;
  return s;
}

void HttpFront::set_request_guard(HandlerWithResponse guard) { impl_->guard = std::move(guard); }
void HttpFront::set_drain_timeout_callback(std::function<void()> callback) {
  impl_->on_drain_timeout = std::move(callback);
}
void HttpFront::set_error_body(std::function<std::string(int, const std::string&, const std::string&)> body) {
  impl_->front_error_body = std::move(body);
}

void HttpFront::close_after_response(httplib::Response& res) {
  if (!t_request) return;
  t_request->close_after = true;
  if (!res.has_header("Connection")) res.set_header("Connection", "close");
}

int HttpFront::read_failure_status() {
  if (!t_request) return 0;
  switch (t_request->failure) {
    case ReadFailure::timeout: return 408;
    case ReadFailure::head_too_large: return 431;
    case ReadFailure::shutting_down: return 503;
    default: return 0;
  }
}

void HttpFront::widen_listen_backlog() {
  const socket_t fd = svr_sock_;
  // Listening again on a listening socket only resizes its accept queue (the kernel caps it
  // at net.core.somaxconn).
  if (fd != INVALID_SOCKET) ::listen(fd, std::max(impl_->limits.max_connections, 1024));
}

bool HttpFront::process_and_close_socket(socket_t sock) {
  impl_->admit(sock);
  return true;
}

bool HttpFront::serve_one(httplib::Stream& stream, bool close_connection, bool& connection_closed) {
  return process_request(stream, close_connection, connection_closed, nullptr);
}

std::string HttpFront::serve_bytes(std::string_view input) {
  std::string output;
  RequestState* state = nullptr;
  MemoryStream stream(input, output, impl_->limits, state);
  for (size_t served = 0; !stream.consumed() && served < impl_->limits.max_requests_per_connection; ++served) {
    RequestState request;
    state = &request;
    t_request = &request;
    bool closed = false;
    bool ok = false;
    try {
      ok = serve_one(stream, false, closed);
    } catch (...) {
      ok = false;
    }
    t_request = nullptr;
    state = nullptr;
    if (!ok || closed || request.close_after || request.failure != ReadFailure::none) break;
  }
  return output;
}

}  // namespace qspec
