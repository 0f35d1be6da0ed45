#include "distributed/comm.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace swiftcpp::dist {

namespace {

// Runs a collective, turning c10d's failures (a peer gone, a timeout) into DistributedError with the rank.
template <typename F>
void guarded(int rank, const char* what, F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string message = e.what();
    if (const auto* c = dynamic_cast<const c10::Error*>(&e)) message = c->what_without_backtrace();
    fail<DistributedError>("rank {}: {} failed (another process died, hung past the timeout or is unreachable): {}",
                           rank, what, message);
  }
}

}  // namespace

struct Communicator::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::chrono::milliseconds timeout;
  at::Device device = at::kCPU;
  std::string host;  // the address Gloo binds to
};

namespace {

c10::intrusive_ptr<c10d::ProcessGroup> make_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  const at::Device& device, const std::string& host,
                                                  std::chrono::milliseconds timeout) {
  if (device.is_cuda()) {
#if defined(USE_C10D_NCCL)
    auto nccl = c10d::ProcessGroupNCCL::Options::create();
    nccl->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store), rank,
                                                       size, nccl);
#else
    fail<ConfigError>("device {} needs NCCL, and this LibTorch was built without it", device.str());
#endif
  }
  auto gloo = c10d::ProcessGroupGloo::Options::create(timeout);
  gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank,
                                                     size, gloo);
}

}  // namespace

Communicator::Communicator(const DistEnv& env, const at::Device& device, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()), rank_(env.rank), size_(env.world_size) {
  impl_->timeout = timeout;
  guarded(rank_, fmt::format("rendezvous at {}:{}", env.master_addr, env.master_port).c_str(), [&] {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(env.master_port);
    options.isServer = env.rank == 0;
    options.numWorkers = env.world_size;
    options.waitWorkers = true;
    options.timeout = timeout;
    impl_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    impl_->device = device;
    impl_->host = env.master_addr == "localhost" ? std::string("127.0.0.1") : env.master_addr;
    impl_->group = make_group(impl_->store, env.rank, env.world_size, device, impl_->host, timeout);
  });
}

std::shared_ptr<Communicator> Communicator::subgroup(const std::vector<int>& ranks, const std::string& name) {
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) fail("subgroup '{}': rank {} is not one of its members", name, rank_);
  std::shared_ptr<Communicator> sub(new Communicator());
  sub->impl_ = std::make_unique<Impl>();
  sub->rank_ = static_cast<int>(it - ranks.begin());
  sub->size_ = static_cast<int>(ranks.size());
  sub->impl_->timeout = impl_->timeout;
  sub->impl_->device = impl_->device;
  sub->impl_->host = impl_->host;
  sub->impl_->store = c10::make_intrusive<c10d::PrefixStore>(name, impl_->store);
  guarded(rank_, fmt::format("forming group '{}'", name).c_str(), [&] {
    sub->impl_->group = make_group(sub->impl_->store, sub->rank_, sub->size_, impl_->device, impl_->host,
                                   impl_->timeout);
  });
  return sub;
}

Communicator::~Communicator() = default;

// The backend's tensors live on the group's device (NCCL takes only CUDA tensors): a tensor elsewhere (host-side
// counters, RNG states) travels through a copy there.
at::Tensor Communicator::on_device(const at::Tensor& t) const {
  return t.device() == impl_->device ? t : t.to(impl_->device);
}

void Communicator::all_reduce_sum(std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> moved;
  for (const auto& t : tensors) moved.push_back(on_device(t));
  guarded(rank_, "all_reduce", [&] {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& t : moved) {
      std::vector<at::Tensor> one{t};
      works.push_back(impl_->group->allreduce(one));
    }
    for (auto& w : works) w->wait(impl_->timeout);
  });
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!moved[i].is_same(tensors[i])) tensors[i].copy_(moved[i]);
  }
}

namespace {

class PendingWork : public Communicator::Pending {
 public:
  PendingWork(c10::intrusive_ptr<c10d::Work> work, std::chrono::milliseconds timeout, int rank)
      : work_(std::move(work)), timeout_(timeout), rank_(rank) {}
  void wait() override {
    guarded(rank_, "all_reduce", [&] { work_->wait(timeout_); });
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::chrono::milliseconds timeout_;
  int rank_;
};

}  // namespace

std::unique_ptr<Communicator::Pending> Communicator::all_reduce_sum_async(at::Tensor& tensor) {
  if (tensor.device() != impl_->device) {
    fail("all_reduce_sum_async: a tensor on {} in a group on {}", tensor.device().str(), impl_->device.str());
  }
  c10::intrusive_ptr<c10d::Work> work;
  guarded(rank_, "all_reduce", [&] {
    std::vector<at::Tensor> one{tensor};
    work = impl_->group->allreduce(one);
  });
  return std::make_unique<PendingWork>(std::move(work), impl_->timeout, rank_);
}

std::vector<double> Communicator::all_reduce_sum(const std::vector<double>& values) {
  std::vector<at::Tensor> t{at::tensor(values, at::kDouble)};
  all_reduce_sum(t);
  return std::vector<double>(t[0].data_ptr<double>(), t[0].data_ptr<double>() + values.size());
}

void Communicator::broadcast(at::Tensor& tensor, int root) {
  at::Tensor moved = on_device(tensor);
  guarded(rank_, "broadcast", [&] {
    std::vector<at::Tensor> one{moved};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    impl_->group->broadcast(one, options)->wait(impl_->timeout);
  });
  if (!moved.is_same(tensor)) tensor.copy_(moved);
}

std::vector<at::Tensor> Communicator::all_gather(const at::Tensor& tensor) {
  const at::Tensor moved = on_device(tensor).contiguous();
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < size_; ++r) out[0].push_back(at::empty_like(moved));
  guarded(rank_, "all_gather", [&] {
    std::vector<at::Tensor> in{moved};
    impl_->group->allgather(out, in)->wait(impl_->timeout);
  });
  if (moved.device() != tensor.device()) {
    for (auto& t : out[0]) t = t.to(tensor.device());
  }
  return out[0];
}

void Communicator::barrier() {
  guarded(rank_, "barrier", [&] { impl_->group->barrier()->wait(impl_->timeout); });
}

std::string Communicator::broadcast_string(const std::string& value, int root, const std::string& key) {
  std::string out;
  guarded(rank_, "store exchange", [&] {
    if (rank_ == root) impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    const std::vector<uint8_t> v = impl_->store->get(key);  // waits up to the store's timeout
    out.assign(v.begin(), v.end());
  });
  return out;
}

}  // namespace swiftcpp::dist
