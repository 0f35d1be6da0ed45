#include "distributed/reducer.h"

#include <ATen/ATen.h>

namespace swiftcpp::dist {

GradientReducer::GradientReducer(std::shared_ptr<Communicator> comm, std::vector<at::Tensor> tensors,
                                 int64_t bucket_bytes, int64_t first_bucket_bytes)
    : comm_(std::move(comm)), tensors_(std::move(tensors)) {
  bucket_of_.assign(tensors_.size(), 0);
  arrived_.resize(tensors_.size());
  int64_t filled = 0;
  for (size_t k = tensors_.size(); k-- > 0;) {
    const at::Tensor& t = tensors_[k];
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    const int64_t limit = buckets_.size() <= 1 ? first_bucket_bytes : bucket_bytes;
    bool fresh = buckets_.empty() || filled + bytes > limit;
    if (!fresh) {
      const at::Tensor& first = tensors_[buckets_.back().members.front()];
      fresh = first.scalar_type() != t.scalar_type() || first.device() != t.device();
    }
    if (fresh) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().members.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    filled += bytes;
  }
  for (size_t k = 0; k < tensors_.size(); ++k) {
    tensors_[k].register_hook([this, k](const at::Tensor& grad) { on_gradient(k, grad); });
  }
}

void GradientReducer::arm() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& a : arrived_) a = at::Tensor();
  for (auto& b : buckets_) {
    b.waiting = static_cast<int64_t>(b.members.size());
    b.flat = at::Tensor();
    b.pending.reset();
  }
  next_ = 0;
  overlapped_ = 0;
  armed_ = true;
}

at::Tensor GradientReducer::gradient_of(size_t index) const {
  if (arrived_[index].defined()) return arrived_[index];
  const at::Tensor& g = tensors_[index].grad();
  return g.defined() ? g : at::zeros_like(tensors_[index]);
}

void GradientReducer::on_gradient(size_t index, const at::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_ || arrived_[index].defined()) return;
  // What AccumulateGrad is about to store: the earlier micro-batches' sum plus this one.
  const at::Tensor& earlier = tensors_[index].grad();
  arrived_[index] = earlier.defined() ? (earlier + grad).detach() : grad.detach().clone();
  --buckets_[bucket_of_[index]].waiting;
  start_ready(false);
}

void GradientReducer::start_ready(bool all) {
  while (next_ < buckets_.size() && (all || buckets_[next_].waiting == 0)) {
    Bucket& b = buckets_[next_];
    std::vector<at::Tensor> views;
    for (size_t k : b.members) views.push_back(gradient_of(k).reshape({-1}));
    b.flat = at::cat(views);
    b.pending = comm_->all_reduce_sum_async(b.flat);
    if (!all) ++overlapped_;
    ++next_;
  }
}

void GradientReducer::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) {  // no backward was armed this step: everything starts now
    for (auto& a : arrived_) a = at::Tensor();
    for (auto& b : buckets_) b.pending.reset();
    next_ = 0;
    overlapped_ = 0;
  }
  armed_ = false;
  start_ready(true);
  std::vector<double> had(tensors_.size(), 0.0);
  for (size_t k = 0; k < tensors_.size(); ++k) {
    had[k] = arrived_[k].defined() || tensors_[k].grad().defined() ? 1.0 : 0.0;
  }
  const std::vector<double> anywhere = comm_->all_reduce_sum(had);
  at::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    b.pending->wait();
    b.pending.reset();
    int64_t offset = 0;
    for (size_t k : b.members) {
      at::Tensor& t = tensors_[k];
      const int64_t n = t.numel();
      if (anywhere[k] > 0) {
        t.mutable_grad() = b.flat.narrow(0, offset, n).view(t.sizes());
      } else {
        t.mutable_grad() = at::Tensor();
      }
      offset += n;
    }
  }
  for (auto& a : arrived_) a = at::Tensor();
}

}  // namespace swiftcpp::dist
