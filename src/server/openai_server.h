// The OpenAI-compatible HTTP server of `sluice serve` (cpp-httplib): /v1/completions and
// /v1/chat/completions (whole or streamed as server-sent events), /v1/models, /health, /metrics
// (Prometheus text), /tokenize, /detokenize and /apply-template (what `sluice chat-template`
// prints). Requests go into an OnlineSession, so they join the running batch at the next step; a
// client that goes away (streaming or not) is cancelled, which frees its sequence before the next
// step. Errors use OpenAI's shape:
// {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "engine/online_session.h"
#include "server/completion_request.h"

namespace httplib {
class Server;
}

namespace sluice::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (port() tells which)
  std::string api_key;  // empty: no Authorization needed
  std::string model_name;
  size_t max_body_bytes = 1 << 20;  // larger bodies get 413
  int max_tokens_default = 256;
  int http_threads = 128;  // each open stream holds one
};

class OpenAiServer {
 public:
  OpenAiServer(ServedModel model, OnlineSession& session, ServerOptions options);
  ~OpenAiServer();

  // Binds the socket (fails with a clear error when it cannot); port() is known after.
  void bind();
  int port() const { return port_; }
  // Serves until stop(); returns then, or at once when stop() came first.
  void listen();
  // Stops accepting connections and ends listen() (safe from any thread; not from a signal
  // handler).
  void stop();

 private:
  void add_routes();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace sluice::server
