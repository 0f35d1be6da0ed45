// Context parallelism: a sequence too long for one rank's memory budget is cut into one contiguous shard per rank
// of a context-parallel (CP) group. Each rank runs the whole model on its shard; in every attention layer the
// shards' K/V are all-gathered (forward) and the gradients of the gathered K/V summed back onto their owners
// (backward: an all-reduce of the gathered gradient, each rank keeping its own shard's slice, which is what a
// reduce-scatter computes; Gloo has no reduce-scatter). Causal attention means shard j only needs shards 0..j.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "distributed/comm.h"
#include "nn/attention.h"

namespace swiftcpp::dist {

/// Shard boundaries of a sequence of `length` tokens over `ranks` ranks: ranks + 1 ascending offsets, shard j =
/// [b[j], b[j+1]) with b[j] = floor(j * length / ranks) (sizes differ by at most one token; none is empty when
/// length >= ranks). Throws Error when ranks < 1 or length < ranks.
std::vector<int64_t> shard_bounds(int64_t length, int64_t ranks);

/// This rank's part in one sharded sequence: the nn::KVExchange the decoder calls in each layer.
class SequenceShard : public nn::KVExchange {
 public:
  /// `group`: the CP group (rank j holds shard j); `length`: the whole sequence's tokens.
  SequenceShard(std::shared_ptr<Communicator> group, int64_t length);

  int64_t offset() const { return bounds_[static_cast<size_t>(group_->rank())]; }
  int64_t size() const { return bounds_[static_cast<size_t>(group_->rank()) + 1] - offset(); }
  const std::vector<int64_t>& bounds() const { return bounds_; }
  Communicator& group() { return *group_; }

  /// k, v: [B, Hkv, size(), Dh] -> [B, Hkv, offset() + size(), Dh] each (one all-gather of K and V together).
  std::pair<at::Tensor, at::Tensor> exchange(const at::Tensor& k, const at::Tensor& v, int64_t layer) override;

 private:
  std::shared_ptr<Communicator> group_;
  std::vector<int64_t> bounds_;
};

}  // namespace swiftcpp::dist
