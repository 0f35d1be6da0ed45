// `swiftcpp deploy`: an OpenAI-compatible HTTP server on the continuous-batching engine.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "apps/swiftcpp/commands.h"
#include "core/error.h"
#include "infer/engine.h"
#include "infer/session.h"
#include "peft/adapter_bank.h"
#include "models/decoder/decoder.h"
#include "serve/server.h"

namespace swiftcpp::app {

namespace {

struct DeployOptions {
  ModelOptions m;
  std::string system;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string served_model_name;
  std::vector<std::string> adapters;  // name=path
  int64_t parallel = 8;
  int64_t max_queue = 64;
  int64_t max_model_len = 0;
  int64_t prefill_chunk = 512;
  double drain_seconds = 10;
  int64_t max_request_bytes = 0;  // 0: 1 MiB, or 32 MiB for a vision-language model (images in data URLs)
  int64_t max_header_bytes = 64 << 10;
  std::string allowed_local_media_path;
  bool allow_remote_media = false;
  int64_t max_images_per_request = 8;
  int64_t max_image_bytes = int64_t{20} << 20;
  int64_t max_image_pixels = int64_t{1} << 25;
  double media_fetch_timeout = 10;
};

int run_deploy(const DeployOptions& o) {
  if (o.parallel < 1 || o.parallel > 256) fail<ConfigError>("--parallel must be in [1, 256], got {}", o.parallel);
  if (o.max_queue < 0) fail<ConfigError>("--max-queue must be >= 0, got {}", o.max_queue);
  if (o.max_model_len < 0) fail<ConfigError>("--max-model-len must be >= 0 (0: the model's context), got {}", o.max_model_len);
  if (o.port < 0 || o.port > 65535) fail<ConfigError>("--port must be in [0, 65535], got {}", o.port);
  if (!(o.drain_seconds >= 0)) fail<ConfigError>("--drain-seconds must be >= 0, got {}", o.drain_seconds);
  if (o.max_request_bytes < 0) fail<ConfigError>("--max-request-bytes must be >= 0 (0: automatic), got {}", o.max_request_bytes);
  if (o.max_header_bytes < 1024) fail<ConfigError>("--max-header-bytes must be >= 1024, got {}", o.max_header_bytes);
  if (o.max_images_per_request < 0) {
    fail<ConfigError>("--max-images-per-request must be >= 0, got {}", o.max_images_per_request);
  }
  if (o.max_image_bytes < 1) fail<ConfigError>("--max-image-bytes must be >= 1, got {}", o.max_image_bytes);
  if (o.max_image_pixels < 1 || o.max_image_pixels > vision::kMaxImagePixels) {
    fail<ConfigError>("--max-image-pixels must be in [1, {}], got {}", vision::kMaxImagePixels, o.max_image_pixels);
  }
  if (!(o.media_fetch_timeout > 0) || o.media_fetch_timeout > 3600) {
    fail<ConfigError>("--media-fetch-timeout must be in (0, 3600] seconds, got {}", o.media_fetch_timeout);
  }
  if (!o.allowed_local_media_path.empty() && !fs::is_directory(o.allowed_local_media_path)) {
    fail<ConfigError>("--allowed-local-media-path '{}' is not a folder", o.allowed_local_media_path);
  }
  const SessionOptions open = o.m.session();

  // SIGTERM and SIGINT go to one thread that shuts the server down; a client that hangs up mid-write must not
  // kill the process (SIGPIPE).
  signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGUSR1);  // sent by this function itself when it ends first
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  serve::ServerOptions server_options;
  server_options.host = o.host;
  server_options.port = o.port;
  server_options.api_key = o.api_key;
  if (server_options.api_key.empty()) {
    if (const char* key = std::getenv("SWIFTCPP_API_KEY")) server_options.api_key = key;
  }
  fs::path model_path = fs::path(o.m.model).lexically_normal();
  if (model_path.filename().empty()) model_path = model_path.parent_path();  // "DIR/"
  server_options.served_model_name = o.served_model_name.empty() ? model_path.filename().string() : o.served_model_name;
  server_options.max_queue = o.max_queue;
  // A vision-language model (its folder has an image processor) takes images inline as base64 data URLs.
  const bool vision = fs::exists(fs::path(o.m.model) / "preprocessor_config.json");
  server_options.max_body_bytes = static_cast<size_t>(o.max_request_bytes > 0 ? o.max_request_bytes
                                                      : vision                ? int64_t{32} << 20
                                                                              : int64_t{1} << 20);
  server_options.max_header_bytes = static_cast<size_t>(o.max_header_bytes);
  server_options.media.allowed_local_path = o.allowed_local_media_path;
  server_options.media.allow_remote = o.allow_remote_media;
  server_options.media.max_images = o.max_images_per_request;
  server_options.media.max_image_bytes = o.max_image_bytes;
  server_options.media.max_pixels = o.max_image_pixels;
  server_options.media.fetch_timeout_s = o.media_fetch_timeout;
  std::vector<std::pair<std::string, std::string>> adapters;
  for (const auto& spec : o.adapters) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      fail<ConfigError>("--adapters takes NAME=PATH (the name requests give as 'model'), got '{}'", spec);
    }
    const std::string name = spec.substr(0, eq), path = spec.substr(eq + 1);
    if (name == server_options.served_model_name) {
      fail<ConfigError>("--adapters {}: the name is the base model's (--served-model-name); pick another", spec);
    }
    for (const auto& [other, p] : adapters) {
      if (other == name) fail<ConfigError>("--adapters: the name '{}' is given twice", name);
    }
    if (!fs::is_directory(path)) fail<IoError>("--adapters {}: {} is not a folder", spec, path);
    adapters.emplace_back(name, path);
    server_options.adapter_names.push_back(name);
  }
  server_options.log = [](const std::string& line) { std::cerr << "[deploy] " << line << std::endl; };
  serve::HttpServer server(server_options);
  const int port = server.start();
  std::cerr << fmt::format("[deploy] listening on http://{}:{} (loading {})", o.host, port, o.m.model) << std::endl;

  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(o.drain_seconds * 1000));
  std::thread signals([&server, stop_signals, grace] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (sig != SIGTERM && sig != SIGINT) return;
    std::cerr << fmt::format("[deploy] {}: finishing running requests (up to {} ms), then exiting",
                             sig == SIGTERM ? "SIGTERM" : "SIGINT", grace.count())
              << std::endl;
    server.shutdown(grace);
  });
  // The signal thread waits for a signal even when loading fails: wake it so it can be joined.
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (!t.joinable()) return;
      pthread_kill(t.native_handle(), SIGUSR1);
      t.join();
    }
  } joiner{signals};

  const auto t0 = std::chrono::steady_clock::now();
  auto session = std::make_shared<ModelSession>(ModelSession::open(open));
  if (!o.system.empty()) {
    if (!session->chat()) fail<ConfigError>("--system needs a chat template: the checkpoint has none (--template NAME)");
    session->system = o.system;
  }
  auto bank = std::make_shared<AdapterBank>();
  for (const auto& [name, path] : adapters) {
    bank->add(session->model, path);
    std::cerr << fmt::format("[deploy] adapter '{}' from {}", name, path) << std::endl;
  }
  session->model->eval();
  EngineOptions engine_options;
  engine_options.adapters = bank;
  engine_options.max_sequences = o.parallel;
  engine_options.max_model_len = o.max_model_len;
  engine_options.prefill_chunk = o.prefill_chunk;
  auto engine = std::make_unique<Engine>(session->model, session->tokenizer, engine_options);
  const int64_t max_len = engine->options().max_model_len;
  session->encode.max_length = std::max<int64_t>(2, max_len);  // images are counted against it before decoding
  server.serve(session, std::move(engine));
  std::cerr << fmt::format("[deploy] ready: '{}' ({} layers, hidden {}) on {} as {}, {} sequences of up to {} tokens, "
                           "loaded in {:.2f} s",
                           server_options.served_model_name, session->model->config().num_hidden_layers,
                           session->model->config().hidden_size, o.m.device, o.m.dtype, o.parallel, max_len,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count())
            << std::endl;
  server.wait();
  std::cerr << "[deploy] stopped" << std::endl;
  return 0;
}

}  // namespace

CommandRun add_deploy_command(CLI::App& root, const GlobalOptions&) {
  auto o = std::make_shared<DeployOptions>();
  CLI::App* cmd = root.add_subcommand("deploy", "Serve a model over an OpenAI-compatible HTTP API (continuous batching)");
  add_model_options(cmd, o->m);
  cmd->add_option("--system", o->system, "System prompt put before every conversation");
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "Key clients must send as 'Authorization: Bearer KEY' (default: "
                  "$SWIFTCPP_API_KEY; none when both are empty)");
  cmd->add_option("--served-model-name", o->served_model_name, "Model name in /v1/models and requests (default: the "
                  "model folder's name)");
  cmd->add_option("--adapters", o->adapters, "NAME=PATH: a PEFT LoRA adapter served beside the base model, repeatable; "
                  "a request's 'model' picks it, and requests for different adapters share a batch")
      ->allow_extra_args(false);
  cmd->add_option("--parallel", o->parallel, "Sequences decoded together")->capture_default_str();
  cmd->add_option("--max-queue", o->max_queue, "Requests that may wait for a free sequence; more get 503")
      ->capture_default_str();
  cmd->add_option("--max-model-len", o->max_model_len, "Tokens per sequence, prompt included (0: the model's context)")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Prompt tokens prefilled per engine step")->capture_default_str();
  cmd->add_option("--max-request-bytes", o->max_request_bytes, "Largest request body; larger ones get 413 (0: 1 MiB, "
                  "32 MiB for a vision-language model)")->capture_default_str();
  cmd->add_option("--max-header-bytes", o->max_header_bytes, "All request headers together; more get 431")
      ->capture_default_str();
  cmd->add_option("--allowed-local-media-path", o->allowed_local_media_path, "Folder whose files image parts may "
                  "name as file:// URLs (default: none)");
  cmd->add_flag("--allow-remote-media", o->allow_remote_media, "Fetch http(s) image URLs (off by default)");
  cmd->add_option("--max-images-per-request", o->max_images_per_request, "Image parts one request may hold")
      ->capture_default_str();
  cmd->add_option("--max-image-bytes", o->max_image_bytes, "Largest encoded image (data URL payload, file or download)")
      ->capture_default_str();
  cmd->add_option("--max-image-pixels", o->max_image_pixels, "Largest image (width x height) a request may send; "
                  "refused from its header before decoding")->capture_default_str();
  cmd->add_option("--media-fetch-timeout", o->media_fetch_timeout, "Seconds a remote image's download may take")
      ->capture_default_str();
  cmd->add_option("--drain-seconds", o->drain_seconds, "On SIGTERM, how long running requests may finish before they "
                  "are cancelled")->capture_default_str();
  return [o]() { return run_deploy(*o); };
}

}  // namespace swiftcpp::app
