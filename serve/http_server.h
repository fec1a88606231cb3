// `kiln serve`'s HTTP side (cpp-httplib): the OpenAI endpoints over the engine.
//
//   GET  /health               503 {"status": "loading"} until attach(), then 200 {"status": "ok"}
//   GET  /v1/models            the one model served
//   POST /v1/chat/completions  Qwen3 chat template; "stream": true for SSE chunks
//   POST /v1/completions       a raw prompt (string or token ids)
//   POST /tokenize, /detokenize
//   GET  /metrics              Prometheus text
//
// Limits: request bodies (413 beyond max_body_bytes), JSON nesting (serve's parser), worker
// threads (connections beyond them wait in the accept queue), read and write timeouts (a
// stalled client is dropped and its request cancelled), and the engine's queue (429).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "models/io/tokenizer.h"
#include "serve/engine.h"

namespace httplib {
class Server;
}

namespace kiln::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (port() says which)
  std::string model_name = "kiln";
  std::size_t max_body_bytes = 1 << 20;
  int threads = 64;
  int timeout_s = 30;  // read and write timeouts
  std::int64_t default_max_tokens = 256;
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions o);
  ~HttpServer();
  // Binds (throws with the address when it cannot); returns the port.
  int bind();
  // Serves until stop(); call on its own thread.
  void listen();
  void stop();
  // The model is loaded: requests are served from now on. Sampling one of eos_ids ends a request
  // (finish_reason "stop"); its text is not returned.
  void attach(const io::Tokenizer& tok, Engine& engine, std::vector<std::int32_t> eos_ids);
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ServerOptions opt_;
  int port_ = 0;
};

}  // namespace kiln::serve
