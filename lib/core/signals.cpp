#include "core/signals.h"

#include <pthread.h>
#include <signal.h>

#include <system_error>

#include "core/error.h"

namespace swiftcpp {

namespace {

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// SIGUSR1 sent to the waiting thread itself (pthread_kill) wakes it to end.
constexpr int kWakeSignal = SIGUSR1;

}  // namespace

void block_stop_signals() {
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void unblock_stop_signals() {
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

bool stop_signals_blocked() {
  sigset_t current;
  sigemptyset(&current);
  pthread_sigmask(SIG_BLOCK, nullptr, &current);
  return sigismember(&current, SIGINT) == 1 && sigismember(&current, SIGTERM) == 1;
}

StopSignals::StopSignals(std::function<bool(int)> on_signal) {
  // The wake signal is blocked in the new thread from its first instruction (it inherits this thread's mask), so
  // the destructor's pthread_kill can never meet it unblocked; this thread gets its own mask back afterwards.
  sigset_t wake, old;
  sigemptyset(&wake);
  sigaddset(&wake, kWakeSignal);
  const sigset_t stops = stop_set();
  sigaddset(&wake, SIGINT);
  sigaddset(&wake, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &wake, &old);
  try {
    thread_ = std::thread([on_signal = std::move(on_signal), stops] {
      sigset_t wait_set = stops;
      sigaddset(&wait_set, kWakeSignal);
      for (;;) {
        int sig = 0;
        if (sigwait(&wait_set, &sig) != 0) continue;
        if (sig == kWakeSignal) return;
        if (on_signal(sig)) continue;
        // The default action, as if the signal had never been caught: unblocked in this thread, sent to it.
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, nullptr);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
        pthread_kill(pthread_self(), sig);
        return;  // not reached for SIGINT / SIGTERM, whose default ends the process
      }
    });
  } catch (const std::system_error& e) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    fail<Error>("cannot start the thread that waits for SIGINT/SIGTERM: {}", e.what());
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

StopSignals::~StopSignals() {
  if (!thread_.joinable()) return;
  pthread_kill(thread_.native_handle(), kWakeSignal);
  thread_.join();
}

}  // namespace swiftcpp
