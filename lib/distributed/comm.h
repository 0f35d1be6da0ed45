// Multi-process training on LibTorch's c10d: the torchrun environment, a TCPStore rendezvous and the collective
// backend (Gloo for CPU tensors; NCCL for CUDA tensors when LibTorch was built with it).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace swiftcpp::dist {

/// The torchrun environment of one worker (apps/swiftcpp reads it: read_dist_environment; lib/ never reads the
/// environment).
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

/// One worker's membership in the job: rendezvous and collectives, each bounded by `timeout`, so a rank that
/// dies or hangs makes the others fail with DistributedError instead of waiting forever.
class Communicator {
 public:
  /// Rank 0 hosts the TCPStore at MASTER_ADDR:MASTER_PORT; every rank connects and the backend group forms.
  /// `device` picks the backend: CPU tensors go through Gloo, CUDA tensors through NCCL. Throws DistributedError
  /// (rendezvous timed out, address unusable) or ConfigError (NCCL asked for without CUDA support).
  Communicator(const DistEnv& env, const at::Device& device, std::chrono::milliseconds timeout);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Collectives take tensors on any device: those not on the group's (the CUDA device for NCCL) travel through a
  /// copy there and back.
  /// Sums each tensor across ranks, in place; all collectives are started before the first is waited for.
  void all_reduce_sum(std::vector<at::Tensor>& tensors);
  /// A started collective.
  class Pending {
   public:
    virtual ~Pending() = default;
    /// Waits for it (up to the timeout). Throws DistributedError as the blocking collectives do.
    virtual void wait() = 0;
  };
  /// Starts summing `tensor` (contiguous, on the group's device, kept alive by the caller until wait() returns)
  /// across ranks in place.
  std::unique_ptr<Pending> all_reduce_sum_async(at::Tensor& tensor);
  /// Sums a few scalars across ranks (one collective): returns the sums in order.
  std::vector<double> all_reduce_sum(const std::vector<double>& values);
  /// Replaces `tensor` on every rank by rank `root`'s, in place.
  void broadcast(at::Tensor& tensor, int root);
  /// The tensors of every rank, in rank order (all the same shape and dtype).
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  /// Waits until every rank arrives.
  void barrier();
  /// Rank `root`'s string on every rank (through the store).
  std::string broadcast_string(const std::string& value, int root, const std::string& key);

  /// A group of some of this job's ranks (`ranks`: their ranks here, ascending, this rank among them) with its own
  /// collectives, rendezvousing through this group's store under `name` (the same name on every member). Only the
  /// members call it. Its rank() is this rank's index in `ranks`. Throws DistributedError as the constructor does,
  /// Error when `ranks` does not hold this rank.
  std::shared_ptr<Communicator> subgroup(const std::vector<int>& ranks, const std::string& name);

 private:
  struct Impl;
  Communicator() = default;
  at::Tensor on_device(const at::Tensor& t) const;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
};


}  // namespace swiftcpp::dist
