// The overlapped gradient reduction (lib/distributed/reducer.h) in a one-process Gloo group: buckets start during the
// armed backward, the sums are the accumulated gradients, and a tensor without a gradient keeps none.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include "core/error.h"
#include "distributed/comm.h"
#include "distributed/context_parallel.h"
#include "distributed/reducer.h"
#include "tests/tensor_util.h"

namespace swiftcpp {
namespace {

std::shared_ptr<dist::Communicator> solo_group() {
  dist::DistEnv env;
  env.master_port = test::free_port();
  return std::make_shared<dist::Communicator>(env, at::Device(at::kCPU), std::chrono::milliseconds(20000));
}

TEST(GradientReducer, BucketsStartDuringTheArmedBackwardAndSumTheAccumulatedGradients) {
  auto comm = solo_group();
  // Three chained layers: backward produces c's gradient first, then b's, then a's; `unused` never gets one (it
  // comes first, so it lands in the last bucket: a bucket waiting for it would hold back every later bucket).
  at::manual_seed(3);
  at::Tensor a = at::randn({512, 512}).requires_grad_(true);  // 1 MiB: a bucket of its own
  at::Tensor b = at::randn({512, 512}).requires_grad_(true);
  at::Tensor c = at::randn({512, 8}).requires_grad_(true);
  at::Tensor unused = at::randn({4}).requires_grad_(true);
  dist::GradientReducer reducer(comm, {unused, a, b, c}, /*bucket_bytes=*/1 << 20, /*first_bucket_bytes=*/1 << 20);
  EXPECT_GE(reducer.buckets(), 3);
  const at::Tensor x1 = at::randn({16, 512}), x2 = at::randn({16, 512});
  const auto loss = [&](const at::Tensor& x) { return x.matmul(a).tanh().matmul(b).tanh().matmul(c).pow(2).sum(); };
  // Reference: the plain accumulated gradients of two micro-batches.
  loss(x1).backward();
  loss(x2).backward();
  const at::Tensor ga = a.grad().clone(), gb = b.grad().clone(), gc = c.grad().clone();
  for (auto* t : {&a, &b, &c}) t->mutable_grad() = at::Tensor();
  // The same with the second backward armed.
  loss(x1).backward();
  reducer.arm();
  loss(x2).backward();
  reducer.finish();
  EXPECT_GE(reducer.overlapped_buckets(), 2) << "buckets should start while backward runs";
  // Up to rounding, not bit for bit: the reference and the armed pass run the same products, but a
  // multi-threaded BLAS may split their sums differently while Gloo's threads run beside the backward (seen on
  // an AVX-512 machine at 2 threads). A wrong bucket, a missed or doubled micro-batch is off by O(1), far above
  // 256 float32 ulps of the largest gradient.
  test::expect_equal_up_to_rounding(a.grad(), ga, 256, "a");
  test::expect_equal_up_to_rounding(b.grad(), gb, 256, "b");
  test::expect_equal_up_to_rounding(c.grad(), gc, 256, "c");
  EXPECT_FALSE(unused.grad().defined());
  // An unarmed step (ChunkFlow, or a rank without micro-batches) reduces everything in finish().
  for (auto* t : {&a, &b, &c}) t->mutable_grad() = at::Tensor();
  loss(x1).backward();
  reducer.finish();
  EXPECT_EQ(reducer.overlapped_buckets(), 0);
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(unused.grad().defined());
}

TEST(ContextParallel, ShardBoundsAreContiguousAndNonEmpty) {
  EXPECT_EQ(dist::shard_bounds(10, 4), (std::vector<int64_t>{0, 2, 5, 7, 10}));
  EXPECT_EQ(dist::shard_bounds(5, 5), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_THROW(dist::shard_bounds(3, 4), Error);
}

}  // namespace
}  // namespace swiftcpp
