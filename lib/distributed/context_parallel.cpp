#include "distributed/context_parallel.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "core/error.h"

namespace swiftcpp::dist {

std::vector<int64_t> shard_bounds(int64_t length, int64_t ranks) {
  if (ranks < 1 || length < ranks) {
    fail("context parallelism: cannot cut {} tokens into {} non-empty shards", length, ranks);
  }
  std::vector<int64_t> b(static_cast<size_t>(ranks) + 1);
  for (int64_t j = 0; j <= ranks; ++j) b[static_cast<size_t>(j)] = j * length / ranks;
  return b;
}

namespace {

// kv: this shard's [B, Hkv, T, 2*Dh] -> the gathered [B, Hkv, offset + T, 2*Dh] of shards 0..j. Backward: the
// gradient of every gathered shard goes back to its owner (an all-reduce of the gathered gradient over the group,
// each rank keeping its own shard's slice).
class GatherShards : public torch::autograd::Function<GatherShards> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& kv, int64_t shard_address) {
    auto* shard = reinterpret_cast<SequenceShard*>(shard_address);
    ctx->saved_data["shard"] = shard_address;
    const auto& b = shard->bounds();
    const int64_t n = static_cast<int64_t>(b.size()) - 1, j = shard->group().rank();
    int64_t width = 0;  // the longest shard: every rank sends a block of that many positions
    for (int64_t i = 0; i < n; ++i) width = std::max(width, b[i + 1] - b[i]);
    at::Tensor block = at::zeros({kv.size(0), kv.size(1), width, kv.size(3)}, kv.options());
    block.narrow(2, 0, kv.size(2)).copy_(kv);
    const std::vector<at::Tensor> blocks = shard->group().all_gather(block);
    std::vector<at::Tensor> parts;
    for (int64_t i = 0; i < j; ++i) parts.push_back(blocks[static_cast<size_t>(i)].narrow(2, 0, b[i + 1] - b[i]));
    parts.push_back(kv);  // this rank's own shard, as it was computed
    return at::cat(parts, 2);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* shard = reinterpret_cast<SequenceShard*>(ctx->saved_data["shard"].toInt());
    const auto& b = shard->bounds();
    const int64_t n = static_cast<int64_t>(b.size()) - 1, j = shard->group().rank();
    const at::Tensor& g = grads[0];  // [B, Hkv, offset + T, 2*Dh]
    // Every rank's gradients for every shard's positions, summed: position p's total lands on its owner.
    at::Tensor total = at::zeros({g.size(0), g.size(1), b[static_cast<size_t>(n)], g.size(3)}, g.options());
    total.narrow(2, 0, g.size(2)).copy_(g);
    std::vector<at::Tensor> one{total};
    shard->group().all_reduce_sum(one);
    return {total.narrow(2, b[static_cast<size_t>(j)], b[static_cast<size_t>(j) + 1] - b[static_cast<size_t>(j)]),
            at::Tensor()};
  }
};

}  // namespace

SequenceShard::SequenceShard(std::shared_ptr<Communicator> group, int64_t length)
    : group_(std::move(group)), bounds_(shard_bounds(length, group_->size())) {}

std::pair<at::Tensor, at::Tensor> SequenceShard::exchange(const at::Tensor& k, const at::Tensor& v, int64_t layer) {
  TORCH_CHECK(k.size(2) == size() && v.size(2) == size(), "context parallelism: layer ", layer, " has ", k.size(2),
              " positions on rank ", group_->rank(), ", its shard has ", size());
  const int64_t dh = k.size(3);
  const at::Tensor kv = GatherShards::apply(at::cat({k, v}, 3), reinterpret_cast<int64_t>(this));
  return {kv.narrow(3, 0, dh), kv.narrow(3, dh, v.size(3))};
}

}  // namespace swiftcpp::dist
