// The data-parallel gradient reduction, overlapped with the last backward of a step.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "distributed/comm.h"

namespace swiftcpp::dist {

/// Sums the gradients of `tensors` across the ranks of `comm` in flat buckets.
///
/// The tensors are dealt into buckets in reverse order (the order backward produces their gradients), per dtype and
/// device, the first bucket at most `first_bucket_bytes` so communication starts early, the others at most
/// `bucket_bytes`. After arm(), the next backward's gradient hook of each tensor records its final gradient (what
/// was accumulated plus what arrives); once every tensor of a bucket is in, and every earlier bucket has started,
/// the bucket is flattened and its all-reduce started while backward goes on. finish() starts the buckets still
/// waiting (a tensor without a gradient joins with zeros; so does every tensor on a rank that ran no backward),
/// exchanges which tensors had a gradient anywhere, waits, and writes the sums into .grad; a tensor no rank had a
/// gradient for is left without one, as in a single process. Buckets start strictly in index order on every rank,
/// so the collectives line up whatever the timing; a tensor that gets no gradient in the armed backward holds back
/// its bucket and every later one until finish().
///
/// Every rank calls finish() once per step, armed or not (a ChunkFlow step runs many backwards and is not armed:
/// its buckets all start in finish()). The hooks stay registered for the reducer's lifetime.
class GradientReducer {
 public:
  GradientReducer(std::shared_ptr<Communicator> comm, std::vector<at::Tensor> tensors,
                  int64_t bucket_bytes = int64_t{25} << 20, int64_t first_bucket_bytes = int64_t{1} << 20);

  /// The next backward is this rank's last of the step: reduce as gradients arrive.
  void arm();
  /// Completes the reduction (a collective: every rank calls it once per step).
  void finish();

  /// Buckets started during backward in the last finished step (how much overlapped).
  int64_t overlapped_buckets() const { return overlapped_; }
  int64_t buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into tensors_
    int64_t waiting = 0;          // members whose gradient has not arrived in the armed backward
    at::Tensor flat;
    std::unique_ptr<Communicator::Pending> pending;
  };

  void on_gradient(size_t index, const at::Tensor& grad);
  // Starts buckets from next_ on while they are complete (or all of them when `all`).
  void start_ready(bool all);
  at::Tensor gradient_of(size_t index) const;

  std::shared_ptr<Communicator> comm_;
  std::vector<at::Tensor> tensors_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  std::vector<at::Tensor> arrived_;  // the armed backward's final gradients, by tensor
  size_t next_ = 0;                  // the next bucket to start
  bool armed_ = false;
  int64_t overlapped_ = 0;
  std::mutex mutex_;
};

}  // namespace swiftcpp::dist
