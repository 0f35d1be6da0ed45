// An OpenAI-compatible HTTP server: /health, /v1/models, /v1/chat/completions, /v1/completions (streamed or
// whole) and /metrics, answering on a thread pool in front of one engine thread (serve/service.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "infer/engine.h"
#include "infer/session.h"
#include "serve/media.h"

namespace swiftcpp::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0: any free port (start() returns it)
  std::string api_key;              // "": no key needed; else /v1/* need "Authorization: Bearer KEY"
  std::string served_model_name;    // the name /v1/models lists and requests may give as `model`
  /// Names of the engine's adapters, adapter i + 1 first: a request's `model` picks one (the base model by its
  /// served name or when absent).
  std::vector<std::string> adapter_names;
  int64_t max_queue = 64;           // requests that may wait for a free sequence row; more get 503
  size_t max_body_bytes = 1 << 20;  // larger bodies get 413; chunked bodies 411, compressed ones 415
  size_t max_header_bytes = 64 << 10;  // all request headers together; more get 431
  /// Image parts of chat requests (vision-language models): where they may come from and their limits.
  MediaOptions media;
  /// One line per request and per lifecycle event; may be empty.
  std::function<void(const std::string&)> log;
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Binds host:port and answers in the background: /health and the API say 503 (with Retry-After) until serve()
  /// attaches a model. Returns the bound port. Throws IoError when the address cannot be bound.
  int start();
  /// Attaches the opened model and its engine; requests are answered from now on.
  void serve(std::shared_ptr<const ModelSession> session, std::unique_ptr<Engine> engine);
  /// Stops taking requests (503), lets the running ones finish for up to `grace`, cancels the rest and closes the
  /// listening socket. Safe to call more than once.
  void shutdown(std::chrono::milliseconds grace);
  /// Blocks until the server has stopped listening.
  void wait();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace swiftcpp::serve
