// The engine behind a server: one thread owns the Engine and steps it while requests run; request threads hand
// sequences in through a queue, read their updates from a ticket, and cancel through it. No model code runs on a
// request thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "infer/engine.h"

namespace swiftcpp::serve {

/// One request's sequences as the engine thread reports on them.
class Ticket {
 public:
  struct Event {
    size_t index = 0;  // which of the request's sequences
    SequenceUpdate update;
  };
  explicit Ticket(size_t sequences) : open_(sequences) {}

  /// Waits up to `timeout` for updates and takes every one that has arrived (empty on timeout or when done).
  std::vector<Event> wait(std::chrono::milliseconds timeout);
  /// True once every sequence has ended and its updates were taken.
  bool done() const;
  /// Asks the engine thread to end every sequence of the request (finish reason "cancelled").
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  /// Set when the engine failed while the request ran: the error's text.
  std::string failure() const;

 private:
  friend class Service;
  void push(size_t index, SequenceUpdate update);
  void fail(const std::string& message);

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Event> events_;
  size_t open_;  // sequences not yet ended
  std::string failure_;
  std::atomic<bool> cancelled_{false};
};

/// Counters for /metrics.
struct ServiceMetrics {
  int64_t requests_running = 0;   // requests with a sequence holding a cache row
  int64_t requests_waiting = 0;   // requests queued for a row
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t requests_total = 0;     // requests accepted since start
  double generation_tokens_per_second = 0;  // over the last 10 seconds
};

class Service {
 public:
  /// `max_waiting`: requests that may wait for a free row beyond those running; more are refused.
  Service(std::unique_ptr<Engine> engine, int64_t max_waiting);
  ~Service();  // cancels what runs and joins the engine thread

  /// Checks a sequence on the caller's thread (Engine::validate).
  void validate(const SequenceRequest& request) const { engine_->validate(request); }
  /// Queues a request's sequences; returns its ticket, or null when the queue is full or the service drains.
  std::shared_ptr<Ticket> submit(std::vector<SequenceRequest> sequences);
  /// Stops taking requests; waits up to `grace` for the running and waiting ones to end, then cancels the rest
  /// and waits for the engine thread to finish.
  void drain(std::chrono::milliseconds grace);

  ServiceMetrics metrics() const;
  const Engine& engine() const { return *engine_; }

 private:
  struct Owner {
    std::shared_ptr<Ticket> ticket;
    size_t index = 0;
  };
  void loop();

  std::unique_ptr<Engine> engine_;
  int64_t max_waiting_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::pair<std::shared_ptr<Ticket>, std::vector<SequenceRequest>>> inbox_;
  std::map<uint64_t, Owner> owners_;                         // engine sequence id -> its request
  std::map<Ticket*, std::vector<uint64_t>> live_;           // request -> its engine sequence ids
  std::map<Ticket*, size_t> started_;                       // request -> sequences that produced a token
  bool accepting_ = true;
  bool stopping_ = false;
  ServiceMetrics totals_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> recent_;  // generated tokens per step
  std::thread thread_;
};

}  // namespace swiftcpp::serve
