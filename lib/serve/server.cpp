#include "serve/server.h"

#include <httplib.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/json.h"
#include "data/encode.h"
#include "serve/openai.h"
#include "serve/service.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp::serve {

namespace {

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(dump(error_json(e)), "application/json");
}

int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const char* reason_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 411: return "invalid_request_error";
    case 413: return "invalid_request_error";
    case 415: return "invalid_request_error";
    case 431: return "invalid_request_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

using LogFn = std::function<void(const std::string&)>;

// The socket a request came on: the one among this process's descriptors whose two ends are the request's
// addresses and ports (cpp-httplib 0.11 does not hand it to handlers); -1 when none is found.
int connection_socket(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  const auto address = [](const sockaddr_storage& a, int& port) {
    char text[INET6_ADDRSTRLEN] = {0};
    if (a.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
      inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
      port = ntohs(in->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
      inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof text);
      port = ntohs(in->sin6_port);
    }
    return std::string(text);
  };
  while (const dirent* entry = readdir(dir)) {
    const int fd = std::atoi(entry->d_name);
    if (fd <= 2 || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_size = sizeof local, peer_size = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0) continue;
    int local_port = -1, peer_port = -1;
    const std::string local_addr = address(local, local_port), peer_addr = address(peer, peer_port);
    if (local_port == req.local_port && peer_port == req.remote_port && peer_addr == req.remote_addr &&
        local_addr == req.local_addr) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

// Whether the client has closed or reset its end of the connection.
bool client_gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// A 500 that carries no library text: the client gets an id, the server's log the id with what happened.
ApiError internal_error(const LogFn& log, const std::string& what) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  const std::string id = fmt::format("err-{:08x}{:04x}", salt & 0xffffffffu, counter.fetch_add(1) & 0xffffu);
  if (log) log(fmt::format("internal error {}: {}", id, what));
  return ApiError(500, "server_error", fmt::format("internal server error {} (the server's log has the details)", id));
}

// A streamed response's progress, shared by httplib's content-provider calls.
struct StreamState {
  LogFn log;
  CompletionRequest request;
  std::shared_ptr<Ticket> ticket;
  std::shared_ptr<const ModelSession> session;
  std::string id, model;
  int64_t created = 0;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  bool started = false;
  bool finished = false;
};

}  // namespace

struct HttpServer::State {
  ServerOptions options;
  httplib::Server http;
  std::thread listener;
  std::mutex listening_mutex;
  std::condition_variable listening_ended;
  bool listening = false;
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  std::shared_ptr<const ModelSession> session;
  std::unique_ptr<Service> service;
  std::atomic<uint64_t> counter{0};
  uint64_t salt = std::random_device{}();
  std::mutex seed_mutex;
  std::mt19937_64 seeds{std::random_device{}()};

  std::string next_id(const char* prefix) {
    return fmt::format("{}-{:016x}{:08x}", prefix, salt, counter.fetch_add(1));
  }
  uint64_t random_seed() {
    std::lock_guard<std::mutex> lock(seed_mutex);
    return seeds();
  }

  // 503 while loading or shutting down; 401 without the right key.
  void admit(const httplib::Request& req) const {
    if (!ready || stopping) {
      throw ApiError(503, "service_unavailable", stopping ? "the server is shutting down" : "the model is still loading");
    }
    if (options.api_key.empty()) return;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.empty()) throw ApiError(401, "authentication_error", "missing API key: send 'Authorization: Bearer KEY'", "", "invalid_api_key");
    if (auth != "Bearer " + options.api_key) throw ApiError(401, "authentication_error", "incorrect API key", "", "invalid_api_key");
  }

  void completions(const httplib::Request& req, httplib::Response& res, bool chat);
};

void HttpServer::State::completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  admit(req);
  const ModelSession& s = *session;
  const Engine& engine = service->engine();
  CompletionRequest request = parse_completion_request(req.body, chat, s.defaults);
  int64_t adapter = 0;
  if (!request.model.empty() && request.model != options.served_model_name) {
    const auto it = std::find(options.adapter_names.begin(), options.adapter_names.end(), request.model);
    if (it == options.adapter_names.end()) {
      std::string names = "'" + options.served_model_name + "'";
      for (const auto& n : options.adapter_names) names += ", '" + n + "'";
      throw ApiError(404, "not_found_error",
                     fmt::format("the model '{}' does not exist; this server serves {}", request.model, names), "model",
                     "model_not_found");
    }
    adapter = (it - options.adapter_names.begin()) + 1;
  }
  std::vector<int64_t> prompt;
  ImageInputs images;  // the request's images, preprocessed once and shared by its n sequences
  if (!request.images.empty() && !s.encode.images) {
    bad_request(request.images.front().param, "this model takes text only: image parts need a vision-language model");
  }
  // Read and checked before the prompt is encoded; each refusal names its part.
  std::vector<vision::EncodedImage> opened = fetch_images(request.images, options.media);
  try {
    if (chat) {
      if (!s.chat()) bad_request("messages", "this model has no chat template: use /v1/completions, or start the server with --template NAME");
      const EncodedPrompt encoded = s.prompt(request.messages, std::move(opened));
      images = encoded.batched_images();
      prompt.assign(encoded.ids.begin(), encoded.ids.end());
    } else if (request.prompt_ids) {
      prompt = *request.prompt_ids;
    } else {
      const std::vector<int> ids = s.encode_raw(request.prompt);
      prompt.assign(ids.begin(), ids.end());
    }
  } catch (const Error& e) {
    bad_request(chat ? "messages" : "prompt", e.what());
  }
  const int64_t max_len = engine.options().max_model_len;
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  const int64_t wanted = request.max_tokens.value_or(std::max<int64_t>(max_len - prompt_tokens, 0));
  if (prompt_tokens + std::max<int64_t>(wanted, 1) > max_len) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("this model's maximum context length is {} tokens; the request asks for {} ({} in the "
                               "{}, {} to generate)", max_len, prompt_tokens + wanted, prompt_tokens,
                               chat ? "messages" : "prompt", wanted),
                   chat ? "messages" : "prompt", "context_length_exceeded");
  }
  std::vector<SequenceRequest> sequences;
  for (int64_t i = 0; i < request.n; ++i) {
    SequenceRequest seq;
    seq.prompt = prompt;
    seq.config.max_new_tokens = wanted;
    seq.config.sampling = request.sampling;
    seq.config.sampling.seed = request.seeded ? request.sampling.seed + static_cast<uint64_t>(i) : random_seed();
    seq.config.stop_strings = request.stop;
    if (!request.ignore_eos) seq.config.eos_ids = s.eos_ids;
    seq.top_logprobs = request.top_logprobs;
    seq.adapter = adapter;
    seq.pixel_values = images.pixel_values;  // the same tensors for every sequence: no copy
    seq.image_grid_thw = images.image_grid_thw;
    sequences.push_back(std::move(seq));
  }
  try {
    service->validate(sequences.front());
  } catch (const Error& e) {
    bad_request(chat ? "messages" : "prompt", e.what());
  }
  std::shared_ptr<Ticket> ticket = service->submit(std::move(sequences));
  if (!ticket) {
    throw ApiError(503, "service_unavailable", stopping ? "the server is shutting down"
                                                        : "too many requests are waiting: retry later", "", "queue_full");
  }
  const std::string id = next_id(chat ? "chatcmpl" : "cmpl");
  const std::string model_name = request.model.empty() ? options.served_model_name : request.model;
  const int64_t created = now_seconds();
  if (!request.stream) {
    std::vector<ChoiceState> choices(request.n);
    // A client that goes away cancels its request, as a streamed one does (checked a few times a second).
    const int socket = connection_socket(req);
    auto checked = std::chrono::steady_clock::now();
    while (!ticket->done()) {
      if (std::chrono::steady_clock::now() - checked > std::chrono::milliseconds(200)) {
        checked = std::chrono::steady_clock::now();
        if (!ticket->cancelled() && client_gone(socket)) ticket->cancel();
      }
      for (auto& event : ticket->wait(std::chrono::milliseconds(200))) {
        ChoiceState& c = choices[event.index];
        c.text += event.update.text;
        c.logprobs.insert(c.logprobs.end(), event.update.logprobs.begin(), event.update.logprobs.end());
        c.completion_tokens = std::max(c.completion_tokens, event.update.completion_tokens);
        if (!event.update.finish_reason.empty()) c.finish_reason = event.update.finish_reason;
      }
    }
    if (!ticket->failure().empty()) throw internal_error(options.log, "generation failed: " + ticket->failure());
    res.set_content(dump(completion_json(request, id, created, model_name, choices, prompt_tokens,
                                         *s.tokenizer)),
                    "application/json");
    return;
  }
  auto st = std::make_shared<StreamState>();
  st->log = options.log;
  st->request = std::move(request);
  st->ticket = ticket;
  st->session = session;
  st->id = id;
  st->model = model_name;
  st->created = created;
  st->prompt_tokens = prompt_tokens;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        const auto send = [&](const Json& j) {
          const std::string line = "data: " + dump(j) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        const TextTokenizer& tokenizer = *st->session->tokenizer;
        const CompletionRequest& r = st->request;
        if (!st->started) {
          st->started = true;
          if (r.chat) {
            for (int64_t i = 0; i < r.n; ++i) {
              if (!send(chunk_json(r, st->id, st->created, st->model, i, true, "", {}, "", tokenizer))) return false;
            }
          }
        }
        for (auto& event : st->ticket->wait(std::chrono::milliseconds(50))) {
          const SequenceUpdate& u = event.update;
          st->completion_tokens += static_cast<int64_t>(u.new_ids.size());
          if (u.finish_reason == "cancelled") continue;
          if (!u.text.empty() || !u.logprobs.empty()) {
            if (!send(chunk_json(r, st->id, st->created, st->model, static_cast<int64_t>(event.index), false, u.text,
                                 u.logprobs, "", tokenizer))) {
              return false;
            }
          }
          if (!u.finish_reason.empty() &&
              !send(chunk_json(r, st->id, st->created, st->model, static_cast<int64_t>(event.index), false, "", {},
                               u.finish_reason, tokenizer))) {
            return false;
          }
        }
        if (!st->ticket->failure().empty()) {
          send(error_json(internal_error(st->log, "generation failed: " + st->ticket->failure())));
          sink.done();
          return true;
        }
        if (st->ticket->done()) {
          if (r.include_usage && !send(usage_chunk_json(r, st->id, st->created, st->model, st->prompt_tokens,
                                                        st->completion_tokens))) {
            return false;
          }
          const std::string end = "data: [DONE]\n\n";
          if (!sink.write(end.data(), end.size())) return false;
          st->finished = true;
          sink.done();
        }
        return true;
      },
      [st](bool success) {
        // A client that went away cancels its own request only.
        if (!success || !st->finished) st->ticket->cancel();
      });
}

HttpServer::HttpServer(ServerOptions options) : state_(std::make_unique<State>()) {
  state_->options = std::move(options);
}

HttpServer::~HttpServer() {
  shutdown(std::chrono::milliseconds(0));
  if (state_->listener.joinable()) state_->listener.join();
}

int HttpServer::start() {
  State& st = *state_;
  httplib::Server& http = st.http;
  const size_t threads = static_cast<size_t>(std::max<int64_t>(16, st.options.max_queue + 24));
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(st.options.max_body_bytes);
  http.set_keep_alive_timeout(2);
  http.set_tcp_nodelay(true);
  const auto guarded = [&st](std::function<void(const httplib::Request&, httplib::Response&)> handler) {
    return [&st, handler](const httplib::Request& req, httplib::Response& res) {
      try {
        handler(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        send_error(res, internal_error(st.options.log, e.what()));
      }
    };
  };
  // Before any body is read: the body limit must hold however the body arrives. A chunked body has no length to
  // check first (411), a compressed one would be inflated past it (415); the headers together stay under their own
  // limit (431).
  http.set_pre_routing_handler([&st](const httplib::Request& req, httplib::Response& res) {
    size_t header_bytes = 0;
    for (const auto& [key, value] : req.headers) header_bytes += key.size() + value.size() + 4;
    if (header_bytes > st.options.max_header_bytes) {
      send_error(res, ApiError(431, "invalid_request_error",
                               fmt::format("the request's headers take {} bytes, more than the {} allowed", header_bytes,
                                           st.options.max_header_bytes)));
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::string encoding = req.get_header_value("Content-Encoding");
    if (!encoding.empty() && encoding != "identity") {
      send_error(res, ApiError(415, "invalid_request_error",
                               fmt::format("Content-Encoding '{}' is not accepted: send the body uncompressed", encoding)));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos) {
      send_error(res, ApiError(411, "invalid_request_error",
                               "a chunked request body is not accepted: send it with a Content-Length"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  const auto not_allowed = [](const httplib::Request& req, httplib::Response& res) {
    send_error(res, ApiError(405, "invalid_request_error", fmt::format("method {} is not allowed on {}", req.method, req.path)));
  };
  http.Get("/health", [&st](const httplib::Request&, httplib::Response& res) {
    if (st.ready && !st.stopping) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    } else {
      send_error(res, ApiError(503, "service_unavailable", st.stopping ? "shutting down" : "loading"));
    }
  });
  http.Get("/v1/models", guarded([&st](const httplib::Request& req, httplib::Response& res) {
             st.admit(req);
             const int64_t created = now_seconds();
             const int64_t max_len = st.service->engine().options().max_model_len;
             Json data = Json::array();
             data.push_back({{"id", st.options.served_model_name}, {"object", "model"}, {"created", created},
                             {"owned_by", "swiftcpp"}, {"root", st.options.served_model_name}, {"parent", nullptr},
                             {"max_model_len", max_len}});
             for (const auto& name : st.options.adapter_names) {
               data.push_back({{"id", name}, {"object", "model"}, {"created", created}, {"owned_by", "swiftcpp"},
                               {"root", name}, {"parent", st.options.served_model_name}, {"max_model_len", max_len}});
             }
             res.set_content(dump(Json{{"object", "list"}, {"data", std::move(data)}}), "application/json");
           }));
  http.Post("/v1/chat/completions", guarded([&st](const httplib::Request& req, httplib::Response& res) {
              st.completions(req, res, true);
            }));
  http.Post("/v1/completions", guarded([&st](const httplib::Request& req, httplib::Response& res) {
              st.completions(req, res, false);
            }));
  http.Get("/metrics", [&st](const httplib::Request&, httplib::Response& res) {
    ServiceMetrics m;
    if (st.ready) m = st.service->metrics();
    std::string text;
    const auto metric = [&](const char* name, const char* type, const char* help, double value) {
      text += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
    };
    metric("swiftcpp_requests_running", "gauge", "Requests generating now.", static_cast<double>(m.requests_running));
    metric("swiftcpp_requests_waiting", "gauge", "Requests waiting for a free sequence row.", static_cast<double>(m.requests_waiting));
    metric("swiftcpp_requests_total", "counter", "Requests accepted since start.", static_cast<double>(m.requests_total));
    metric("swiftcpp_prompt_tokens_total", "counter", "Prompt tokens prefilled.", static_cast<double>(m.prompt_tokens_total));
    metric("swiftcpp_generation_tokens_total", "counter", "Tokens generated.", static_cast<double>(m.generation_tokens_total));
    metric("swiftcpp_generation_tokens_per_second", "gauge", "Tokens generated per second over the last 10 s.",
           m.generation_tokens_per_second);
    res.set_content(text, "text/plain; version=0.0.4");
  });
  for (const char* path : {"/health", "/v1/models", "/metrics"}) {
    http.Post(path, not_allowed);
    http.Put(path, not_allowed);
    http.Delete(path, not_allowed);
    http.Patch(path, not_allowed);
  }
  for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
    http.Get(path, not_allowed);
    http.Put(path, not_allowed);
    http.Delete(path, not_allowed);
    http.Patch(path, not_allowed);
  }
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string message = res.status == 404   ? fmt::format("no route {} {}", req.method, req.path)
                                : res.status == 413 ? "the request body is larger than the server accepts"
                                                    : fmt::format("HTTP {}", res.status);
    res.set_content(dump(error_json(ApiError(res.status, reason_type(res.status), message))), "application/json");
  });
  if (st.options.log) {
    http.set_logger([&st](const httplib::Request& req, const httplib::Response& res) {
      st.options.log(fmt::format("{} {} {}", req.method, req.path, res.status));
    });
  }
  int port = st.options.port;
  if (port == 0) {
    port = http.bind_to_any_port(st.options.host);
    if (port <= 0) fail<IoError>("cannot listen on {} (any port)", st.options.host);
  } else if (!http.bind_to_port(st.options.host, port)) {
    fail<IoError>("cannot listen on {}:{} (in use, or not an address of this machine?)", st.options.host, port);
  }
  st.listening = true;
  st.listener = std::thread([&st] {
    st.http.listen_after_bind();
    {
      std::lock_guard<std::mutex> lock(st.listening_mutex);
      st.listening = false;
    }
    st.listening_ended.notify_all();
  });
  return port;
}

void HttpServer::serve(std::shared_ptr<const ModelSession> session, std::unique_ptr<Engine> engine) {
  State& st = *state_;
  st.session = std::move(session);
  st.service = std::make_unique<Service>(std::move(engine), st.options.max_queue);
  st.ready = true;
}

void HttpServer::shutdown(std::chrono::milliseconds grace) {
  State& st = *state_;
  if (st.stopping.exchange(true)) {
    wait();
    return;
  }
  if (st.service) st.service->drain(grace);
  st.http.stop();
  wait();
}

void HttpServer::wait() {
  State& st = *state_;
  std::unique_lock<std::mutex> lock(st.listening_mutex);
  st.listening_ended.wait(lock, [&] { return !st.listening; });
}

}  // namespace swiftcpp::serve
