// Child processes: run a program with input on its stdin, collect its stdout and stderr, its exit status and its
// peak resident memory, with an optional time limit and a stop flag that forwards SIGINT to it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace swiftcpp {

struct ProcessOptions {
  std::string input;                          // written to the child's stdin, which is then closed
  double timeout_s = 0;                       // > 0: the child's process group is killed (SIGKILL) after this long
  const std::atomic<bool>* stop = nullptr;    // once true: SIGINT to the child's process group, once
  int64_t max_output_bytes = 0;               // > 0: stdout or stderr past this kills the child's process group
};

/// What running a process produced.
struct ProcessResult {
  int exit_code = 0;  // the exit status, or 128 + signal
  bool timed_out = false;
  bool output_exceeded = false;  // killed for printing more than max_output_bytes (out / err hold that much)
  std::string out, err;
  int64_t peak_rss_bytes = 0;  // the child's peak resident set (wait4's ru_maxrss)
  double seconds = 0;          // wall time from start to exit
};

/// Runs argv[0] (a path; no PATH search, no shell) with arguments argv[1..] in a process group of its own, feeding
/// it options.input and collecting its stdout and stderr until it exits. Throws IoError when it cannot be started
/// (no pipe, no fork); a program that cannot be executed exits 127.
ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options = {});

/// Runs `/bin/sh -c command` (run_process) with `input` on its stdin, killing its process group after `timeout_s`
/// seconds or once it prints more than `max_output_bytes` (> 0) on stdout or stderr. Throws IoError when the
/// process cannot be started.
ProcessResult run_command(const std::string& command, const std::string& input, double timeout_s,
                          int64_t max_output_bytes = 0);

/// The last `lines` lines of `text` (all of it when it has fewer), without a trailing newline.
std::string last_lines(const std::string& text, size_t lines);

}  // namespace swiftcpp
