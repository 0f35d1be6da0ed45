#include "core/process.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"

namespace swiftcpp {

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options) {
  if (argv.empty()) fail<Error>("run_process: no program given");
  const std::string& program = argv[0];
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) fail<IoError>("cannot run '{}': pipe: {}", program, std::strerror(errno));
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    fail<IoError>("cannot run '{}': pipe: {}", program, std::strerror(errno));
  }
  // A child that exits without reading all its input makes our writes fail with EPIPE; SIGPIPE stays blocked in
  // this thread meanwhile (and a pending one is consumed) so that it cannot end the process.
  sigset_t pipe_signal, old_mask;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, &old_mask);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    fail<IoError>("cannot run '{}': fork: {}", program, std::strerror(errno));
  }
  if (pid == 0) {
    // An empty mask, not this thread's: the stop signals are blocked here (core/signals.h) and exec would keep
    // them blocked, so a stop (SIGINT) or a timeout's SIGTERM could not reach the child.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    setpgid(0, 0);  // its own process group, so a timeout or a stop reaches what it started too
    dup2(in_pipe[0], 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    signal(SIGPIPE, SIG_DFL);
    execv(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  int to_child = in_pipe[1];
  fcntl(to_child, F_SETFL, fcntl(to_child, F_GETFL) | O_NONBLOCK);
  ProcessResult result;
  size_t written = 0;
  if (options.input.empty()) {
    close(to_child);
    to_child = -1;
  }
  const bool limited = options.timeout_s > 0;
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(limited ? options.timeout_s : 0.0));
  bool stop_sent = false;
  // Forwards a stop request once and says whether the time limit has passed.
  const auto check = [&] {
    if (options.stop != nullptr && !stop_sent && options.stop->load()) {
      kill(-pid, SIGINT);
      stop_sent = true;
    }
    return limited && std::chrono::steady_clock::now() >= deadline;
  };
  int open_outputs = 2;
  bool out_open = true, err_open = true;
  char buffer[65536];
  while (open_outputs > 0) {
    if (check()) {
      result.timed_out = true;
      break;
    }
    int wait_ms = 100;  // a stop request is seen within this
    if (limited) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      wait_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 1, wait_ms));
    }
    pollfd fds[3];
    int n = 0;
    int out_i = -1, err_i = -1, in_i = -1;
    if (out_open) fds[out_i = n++] = {out_pipe[0], POLLIN, 0};
    if (err_open) fds[err_i = n++] = {err_pipe[0], POLLIN, 0};
    if (to_child >= 0) fds[in_i = n++] = {to_child, POLLOUT, 0};
    const int ready = poll(fds, static_cast<nfds_t>(n), wait_ms);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    const auto drain = [&](int index, int fd, std::string& into, bool& open) {
      if (index < 0 || (fds[index].revents & (POLLIN | POLLHUP | POLLERR)) == 0) return;
      const ssize_t got = read(fd, buffer, sizeof(buffer));
      if (got > 0) {
        const auto limit = static_cast<size_t>(options.max_output_bytes);
        if (limit > 0 && into.size() + static_cast<size_t>(got) > limit) {
          into.append(buffer, limit - into.size());
          result.output_exceeded = true;
          return;
        }
        into.append(buffer, static_cast<size_t>(got));
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        open = false;
        --open_outputs;
      }
    };
    drain(out_i, out_pipe[0], result.out, out_open);
    drain(err_i, err_pipe[0], result.err, err_open);
    if (result.output_exceeded) break;
    if (in_i >= 0 && (fds[in_i].revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      const ssize_t put = write(to_child, options.input.data() + written, options.input.size() - written);
      if (put > 0) written += static_cast<size_t>(put);
      if ((put < 0 && errno != EAGAIN && errno != EINTR) || written == options.input.size()) {
        close(to_child);  // all given (or the child stopped reading): it sees the end of its input
        to_child = -1;
      }
    }
  }
  if (to_child >= 0) close(to_child);
  close(out_pipe[0]);
  close(err_pipe[0]);
  int status = 0;
  rusage usage{};
  bool reaped = false;
  while (!result.timed_out && !result.output_exceeded) {  // outputs closed: the child has until the deadline to exit
    const pid_t done = wait4(pid, &status, WNOHANG, &usage);
    if (done == pid || (done < 0 && errno != EINTR)) {
      reaped = done == pid;
      break;
    }
    if (check()) {
      result.timed_out = true;
      break;
    }
    usleep(1000);
  }
  if (result.timed_out || result.output_exceeded) {
    kill(-pid, SIGKILL);
    while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
    }
    reaped = true;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const timespec no_wait{0, 0};
  while (sigtimedwait(&pipe_signal, nullptr, &no_wait) > 0) {
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  if (reaped) result.peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux: KiB
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  return result;
}

ProcessResult run_command(const std::string& command, const std::string& input, double timeout_s,
                          int64_t max_output_bytes) {
  ProcessOptions options;
  options.input = input;
  options.timeout_s = timeout_s;
  options.max_output_bytes = max_output_bytes;
  return run_process({"/bin/sh", "-c", command}, options);
}

std::string last_lines(const std::string& text, size_t lines) {
  size_t end = text.size();
  while (end > 0 && text[end - 1] == '\n') --end;
  if (lines == 0) return "";
  size_t start = end;
  for (size_t found = 0; start > 0;) {
    const size_t newline = text.rfind('\n', start - 1);
    if (newline == std::string::npos) {
      start = 0;
      break;
    }
    if (++found == lines) {
      start = newline + 1;
      break;
    }
    start = newline;
  }
  return text.substr(start, end - start);
}

}  // namespace swiftcpp
