#include "serve/service.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <exception>

#include <ATen/Parallel.h>

namespace swiftcpp::serve {

std::vector<Ticket::Event> Ticket::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return !events_.empty() || open_ == 0; });
  std::vector<Event> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

bool Ticket::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_ == 0 && events_.empty();
}

std::string Ticket::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void Ticket::push(size_t index, SequenceUpdate update) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!update.finish_reason.empty() && open_ > 0) --open_;
    events_.push_back({index, std::move(update)});
  }
  ready_.notify_all();
}

void Ticket::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = message;
    open_ = 0;
  }
  ready_.notify_all();
}

Service::Service(std::unique_ptr<Engine> engine, int64_t max_waiting)
    : engine_(std::move(engine)), max_waiting_(max_waiting), thread_([this] { loop(); }) {}

Service::~Service() { drain(std::chrono::milliseconds(0)); }

std::shared_ptr<Ticket> Service::submit(std::vector<SequenceRequest> sequences) {
  auto ticket = std::make_shared<Ticket>(sequences.size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t requests = static_cast<int64_t>(live_.size() + inbox_.size());
    if (!accepting_ || requests >= engine_->options().max_sequences + max_waiting_) return nullptr;
    ++totals_.requests_total;
    inbox_.emplace_back(ticket, std::move(sequences));
  }
  wake_.notify_all();
  return ticket;
}

void Service::drain(std::chrono::milliseconds grace) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    accepting_ = false;
    wake_.wait_for(lock, grace, [&] { return live_.empty() && inbox_.empty(); });
    for (auto& [ticket, ids] : live_) ticket->cancel();
    for (auto& [ticket, requests] : inbox_) ticket->cancel();
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

ServiceMetrics Service::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ServiceMetrics m = totals_;
  m.requests_waiting = static_cast<int64_t>(inbox_.size());
  for (const auto& [ticket, ids] : live_) {
    const auto it = started_.find(ticket);
    if (it != started_.end() && it->second > 0) ++m.requests_running;
    else ++m.requests_waiting;
  }
  const auto now = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  for (const auto& [t, n] : recent_) {
    if (now - t <= std::chrono::seconds(10)) tokens += n;
  }
  m.generation_tokens_per_second = tokens / 10.0;
  return m;
}

void Service::loop() {
  // LibTorch's thread settings (OpenMP team size) are per thread: a new thread takes them from set_num_threads only
  // through init_num_threads, or its forwards run with a default team that fights the configured one for cores.
  at::init_num_threads();
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || engine_->has_work(); });
    if (stopping_ && inbox_.empty()) {
      // Whatever still runs was cancelled by drain(): let the engine end it, then stop.
      for (auto& [ticket, ids] : live_) {
        for (uint64_t id : ids) engine_->cancel(id);
      }
      if (!engine_->has_work()) break;
    }
    for (auto& [ticket, requests] : inbox_) {
      std::vector<uint64_t>& ids = live_[ticket.get()];
      for (size_t i = 0; i < requests.size(); ++i) {
        try {
          const uint64_t id = engine_->add(std::move(requests[i]));
          owners_[id] = {ticket, i};
          ids.push_back(id);
        } catch (const std::exception& e) {  // validated on the request thread; a late refusal ends the request
          for (uint64_t id : ids) engine_->cancel(id);
          ticket->fail(e.what());
        }
      }
    }
    inbox_.clear();
    for (auto& [ticket, ids] : live_) {
      if (ticket->cancelled()) {
        for (uint64_t id : ids) engine_->cancel(id);
      }
    }
    if (!engine_->has_work()) {
      // Every request refused late: forget them.
      for (auto it = live_.begin(); it != live_.end();) {
        started_.erase(it->first);
        it = live_.erase(it);
      }
      wake_.notify_all();
      continue;
    }
    lock.unlock();
    std::vector<SequenceUpdate> updates;
    std::string failure;
    try {
      updates = engine_->step();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    lock.lock();
    if (!failure.empty()) {
      // The engine could not run the step: every request in it fails, and the engine ends their sequences.
      for (auto& [ticket, ids] : live_) {
        for (uint64_t id : ids) engine_->cancel(id);
      }
      for (auto& [id, owner] : owners_) owner.ticket->fail(failure);
      continue;
    }
    int64_t generated = 0;
    for (auto& update : updates) {
      const auto it = owners_.find(update.id);
      if (it == owners_.end()) continue;
      const Owner owner = it->second;
      const uint64_t id = it->first;
      generated += static_cast<int64_t>(update.new_ids.size());
      if (!update.new_ids.empty() && update.completion_tokens == static_cast<int64_t>(update.new_ids.size())) {
        totals_.prompt_tokens_total += update.prompt_tokens;  // a sequence's first token: its prompt is done
        ++started_[owner.ticket.get()];
      }
      const bool ended = !update.finish_reason.empty();
      owner.ticket->push(owner.index, std::move(update));
      if (ended) {
        owners_.erase(it);
        auto& ids = live_[owner.ticket.get()];
        ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
      }
    }
    // A request whose sequences all ended leaves.
    for (auto it = live_.begin(); it != live_.end();) {
      if (it->second.empty()) {
        started_.erase(it->first);
        it = live_.erase(it);
      } else {
        ++it;
      }
    }
    totals_.generation_tokens_total += generated;
    const auto now = std::chrono::steady_clock::now();
    recent_.emplace_back(now, generated);
    while (!recent_.empty() && now - recent_.front().first > std::chrono::seconds(10)) recent_.pop_front();
    wake_.notify_all();
  }
}

}  // namespace swiftcpp::serve
