// `swiftcpp train --nproc-per-node N`: the built-in launcher. It starts N worker processes of this same binary
// with the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
// forwards SIGINT/SIGTERM to them, and when one fails stops the others and exits with its code.
#pragma once

#include <string>
#include <vector>

#include "distributed/comm.h"

namespace swiftcpp::app {

struct LaunchOptions {
  int nproc_per_node = 0;  // 0: no launcher (this process is a worker, or the only process)
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;     // 0: a free port on this machine (one node), else 29500
  double grace_seconds = 10;  // after one worker fails: SIGTERM to the rest, SIGKILL this long after
};

/// Runs the workers: `worker_argv` is this process's command line without the launcher options. Returns the exit
/// code: 0 when every worker exits 0, else the first failure's (128 + signal for a worker killed by a signal).
/// Throws ConfigError for bad options and IoError when a worker cannot be started.
int launch_workers(const LaunchOptions& options, const std::vector<std::string>& worker_argv);

/// This worker's torchrun environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (torchrun, srun
/// wrappers and the launcher above set them). Without WORLD_SIZE: one process (rank 0 of 1). Throws ConfigError
/// naming the variable when one is malformed, RANK is outside [0, WORLD_SIZE), or WORLD_SIZE > 1 without RANK.
dist::DistEnv read_dist_environment();

/// `argv` without the launcher's own options (--nproc-per-node, --nnodes, --node-rank, --master-addr,
/// --master-port, as "--opt value" or "--opt=value").
std::vector<std::string> strip_launcher_options(const std::vector<std::string>& argv);

}  // namespace swiftcpp::app
