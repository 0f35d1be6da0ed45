#include "apps/swiftcpp/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include "core/error.h"
#include "core/signals.h"

namespace swiftcpp::app {

namespace {

constexpr int kMaxWorkers = 1024;
std::atomic<pid_t> g_workers[kMaxWorkers];
std::atomic<int> g_worker_count{0};

// Also on the signal thread (core/signals.h): every SIGINT/SIGTERM is passed on to the workers.
void forward_signal(int signal) {
  for (int i = 0; i < g_worker_count.load(); ++i) {
    const pid_t pid = g_workers[i].load();
    if (pid > 0) kill(pid, signal);
  }
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) fail<IoError>("cannot open a socket to find a free port: {}", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    fail<IoError>("cannot find a free port: {}", std::strerror(errno));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

std::vector<std::string> strip_launcher_options(const std::vector<std::string>& argv) {
  static const char* options[] = {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port"};
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    bool skip = false;
    for (const char* o : options) {
      if (argv[i] == o) {
        skip = true;
        ++i;  // and its value
        break;
      }
      if (argv[i].rfind(std::string(o) + "=", 0) == 0) {
        skip = true;
        break;
      }
    }
    if (!skip) out.push_back(argv[i]);
  }
  return out;
}

int launch_workers(const LaunchOptions& o, const std::vector<std::string>& worker_argv) {
  if (o.nproc_per_node < 1 || o.nproc_per_node > kMaxWorkers) {
    fail<ConfigError>("--nproc-per-node must be in [1, {}] (got {})", kMaxWorkers, o.nproc_per_node);
  }
  if (o.nnodes < 1) fail<ConfigError>("--nnodes must be at least 1 (got {})", o.nnodes);
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    fail<ConfigError>("--node-rank must be in [0, --nnodes) = [0, {}) (got {})", o.nnodes, o.node_rank);
  }
  if (o.nnodes > 1 && o.master_port == 0) fail<ConfigError>("--nnodes > 1 needs --master-port (the same on every node)");
  const int port = o.master_port != 0 ? o.master_port : free_port();
  const int world = o.nnodes * o.nproc_per_node;
  std::vector<char*> args;
  for (const auto& a : worker_argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) fail<IoError>("cannot find this program's path (/proc/self/exe): {}", std::strerror(errno));
  exe[n] = '\0';

  const StopSignals signals([](int signal) {
    forward_signal(signal);
    return true;
  });
  std::cerr << fmt::format("swiftcpp: starting {} worker processes (world size {}, master {}:{})\n", o.nproc_per_node,
                           world, o.master_addr, port);
  for (int local = 0; local < o.nproc_per_node; ++local) {
    const pid_t pid = fork();
    if (pid < 0) {
      forward_signal(SIGKILL);
      fail<IoError>("cannot start worker {}: {}", local, std::strerror(errno));
    }
    if (pid == 0) {
      const int rank = o.node_rank * o.nproc_per_node + local;
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
      setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      execv(exe, args.data());
      std::fprintf(stderr, "swiftcpp: cannot start worker %d: %s\n", local, std::strerror(errno));
      _exit(127);
    }
    g_workers[local] = pid;
    g_worker_count = local + 1;
  }

  // Wait for all; after the first failure, the others get SIGTERM and, grace_seconds later, SIGKILL.
  int result = 0, running = o.nproc_per_node;
  bool failed = false, killed = false;
  auto failed_at = std::chrono::steady_clock::now();
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --running;
      int local = 0;
      for (; local < o.nproc_per_node && g_workers[local] != pid; ++local) {
      }
      if (local < o.nproc_per_node) g_workers[local] = -1;
      const int code = exit_code(status);
      if (code != 0 && !failed) {
        failed = true;
        result = code;
        failed_at = std::chrono::steady_clock::now();
        std::cerr << fmt::format("swiftcpp: worker {} (rank {}) exited with {}; stopping the others\n", local,
                                 o.node_rank * o.nproc_per_node + local, code);
        forward_signal(SIGTERM);
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (failed && !killed &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - failed_at).count() > o.grace_seconds) {
      forward_signal(SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

namespace {

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi) {
    fail<ConfigError>("environment variable {}={} is not an integer in [{}, {}]", name, v, lo, hi);
  }
  return static_cast<int>(x);
}

}  // namespace

dist::DistEnv read_dist_environment() {
  dist::DistEnv env;
  env.world_size = env_int("WORLD_SIZE", 1, 1, 1 << 20);
  env.rank = env_int("RANK", 0, 0, env.world_size - 1);
  env.local_rank = env_int("LOCAL_RANK", env.rank, 0, 1 << 20);
  if (const char* a = std::getenv("MASTER_ADDR"); a != nullptr && *a != '\0') env.master_addr = a;
  env.master_port = env_int("MASTER_PORT", 29500, 1, 65535);
  if (env.world_size > 1 && std::getenv("RANK") == nullptr) {
    fail<ConfigError>("WORLD_SIZE is {} but RANK is not set: start workers with torchrun, srun or swiftcpp train "
                      "--nproc-per-node", env.world_size);
  }
  return env;
}

}  // namespace swiftcpp::app
