// The limits and TLS files of the server's connection layer (server/http_front.h), without
// cpp-httplib, so that the server's options and `qspec serve`'s flags can name them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace qspec {

// The limits of the connection layer; `qspec serve` exposes them as flags.
struct HttpLimits {
  int worker_threads = 128;              // requests served at once (a stream holds one)
  int max_connections = 1024;            // open connections, idle ones included; 503 beyond
  double request_timeout_seconds = 30;   // to receive one request (head and body); 408 beyond
  double keep_alive_seconds = 5;         // an idle connection between two requests
  double write_timeout_seconds = 30;     // one write to a client that does not read
  double drain_timeout_seconds = 30;     // shutdown: requests in flight get this long
  size_t max_header_bytes = 64 << 10;    // request line + headers; 431 beyond
  size_t max_header_count = 100;         // header fields; 431 beyond
  size_t max_requests_per_connection = 1000;
};

// PEM files for --ssl-certfile / --ssl-keyfile.
struct TlsFiles {
  std::string cert_file, key_file;
};

struct HttpFrontStats {
  int64_t connections_accepted = 0;
  int64_t connections_refused = 0;   // 503: over max_connections
  int64_t request_timeouts = 0;      // 408: a request not received within its deadline
  int64_t heads_too_large = 0;       // 431
  int64_t tls_handshake_failures = 0;
  int64_t connections_open = 0;      // now
};

}  // namespace qspec
