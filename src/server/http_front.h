// The connection layer of `qspec serve`, under cpp-httplib's request parsing and routing: it
// owns the sockets, so that no client can take the server down or hold it hostage.
//
//   * A plain-HTTP request reaches a worker thread only once its request line and headers are
//     all in: slow or idle clients wait in one poll loop (the collector), not in a worker.
//   * Each request is read under a deadline (headers and body together) and byte caps (the
//     head; the body's decoded size is the routes' own cap); 408 / 431 beyond them.
//   * Open connections are bounded; the one over the bound gets a 503 and is closed.
//   * TLS (OpenSSL) is terminated here: a TLS connection is served in one worker, under the
//     same deadlines.
//   * Shutdown closes idle connections at once, waits for requests in flight for a bounded
//     time, then calls the drain-timeout callback (the server cancels its generations) and
//     cuts what is left.
// Routes, handlers and the logger are httplib::Server's, set on this object as usual.
#pragma once
#include <httplib.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "server/http_limits.h"

namespace qspec {

class HttpFront : public httplib::Server {
 public:
  // Throws qspec::Error when the TLS files do not load (naming the file).
  explicit HttpFront(HttpLimits limits, const std::optional<TlsFiles>& tls = std::nullopt);
  ~HttpFront() override;

  const HttpLimits& limits() const;
  HttpFrontStats stats() const;

  // The guard every routed request passes before its handler (API key, for one): returning
  // Handled answers with `res` as the guard left it, and closes the connection after it when the
  // request declared a body (left unread). The header-count limit runs before it.
  void set_request_guard(HandlerWithResponse guard);
  // Called once when shutdown's drain_timeout_seconds pass with requests still in flight.
  void set_drain_timeout_callback(std::function<void()> callback);

  // The body of the answers the connection layer writes itself (408, 431, 503), from the
  // status, a message and a code; default: the message as it is.
  void set_error_body(std::function<std::string(int, const std::string&, const std::string&)> body);

  // For handlers, on the thread serving the request: the connection closes after this
  // response (a body left unread, say), and the response says so ("Connection: close"), so a
  // client does not send its next request on a connection the server is closing.
  static void close_after_response(httplib::Response& res);
  // For the error handler, on the thread serving the request: 408 when the request's read
  // failed on its deadline, 431 when its head outgrew max_header_bytes, else 0.
  static int read_failure_status();

  // After bind: a listen backlog for bursts of connections (httplib listens with 5, and a
  // burst beyond the accept queue gets its connections reset).
  void widen_listen_backlog();

  // For tests and the fuzz target: serves `input` as the bytes one connection sent, through
  // the same request parsing, limits and routes, and returns the bytes written back.
  std::string serve_bytes(std::string_view input);

  struct Impl;

 private:
  bool process_and_close_socket(socket_t sock) override;
  friend struct Impl;
  bool serve_one(httplib::Stream& stream, bool close_connection, bool& connection_closed);
  std::unique_ptr<Impl> impl_;
};

}  // namespace qspec
