// Stop signals (SIGINT, SIGTERM) taken by one waiting thread, never by a handler on a computing thread.
//
// A signal handler runs on the stack of the thread the signal interrupts, and oneDNN's JIT GEMM (kernels::sgemm,
// nn::Linear's products) points the stack pointer into a heap buffer while it runs: the signal frame the kernel
// pushed there overwrote heap memory (glibc's "corrupted size vs. prev_size", SIGABRT or SIGSEGV in about one of
// ten training runs stopped by SIGTERM mid-step). So no handler is installed: block_stop_signals() blocks the two
// signals in the main thread before any other thread exists (every later thread inherits the mask), and a
// StopSignals object waits for them with sigwait() on a thread of its own, whose stack is always its own.
// Child processes start with an empty mask (core/process.h); exec keeps the blocked mask, so a program that execs
// itself calls block_stop_signals() again in main.
#pragma once

#include <functional>
#include <thread>

namespace swiftcpp {

/// Blocks SIGINT and SIGTERM in the calling thread (call it first in main, before any thread starts).
void block_stop_signals();

/// Unblocks them in the calling thread: they end the process by their default action again (for a command that
/// has no clean stop). Threads started while they were blocked keep them blocked, which is harmless: a process
/// signal goes to a thread that does not block it.
void unblock_stop_signals();

/// Whether SIGINT and SIGTERM are both blocked in the calling thread.
bool stop_signals_blocked();

/// Waits for SIGINT / SIGTERM on its own thread while it lives. For each one, on_signal(signal) runs on that thread;
/// when it returns false the signal ends the process as its default action would (a second Ctrl-C). The signals
/// must be blocked in every thread (block_stop_signals() in main): otherwise one may still reach another thread
/// and end the process there. The destructor stops and joins the thread; the signals stay blocked.
class StopSignals {
 public:
  explicit StopSignals(std::function<bool(int signal)> on_signal);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  std::thread thread_;
};

}  // namespace swiftcpp
