// Matrix products of training and prompt processing through the fast float32 GEMM (kernels::sgemm) with their own
// backward, and the language-model head's cross-entropy over row chunks, so [tokens, vocab] logits never exist at
// once. Each falls back to LibTorch where the fast path does not apply (other dtypes or devices, autocast).
#pragma once

#include <ATen/core/Tensor.h>

namespace swiftcpp::nn {

/// a [M, K] @ b [K, N] -> [M, N]. float32 CPU operands whose rows or columns are contiguous go through
/// kernels::sgemm where the build has it; anything else through at::mm. Not recorded by autograd.
at::Tensor mm(const at::Tensor& a, const at::Tensor& b);

/// a [..., M, K] @ b [..., K, N] with the same leading dimensions -> [..., M, N]. float32 CPU operands whose matrices
/// have contiguous rows or columns: one kernels::sgemm a matrix, the matrices spread over LibTorch's threads (each
/// product then single-threaded); anything else at::matmul. Not recorded by autograd.
at::Tensor bmm(const at::Tensor& a, const at::Tensor& b);

/// c = a @ b + beta * c into an existing row-contiguous c [M, N] (the fast path writes in place; otherwise c is
/// updated from at::mm). Not recorded by autograd.
void mm_into(const at::Tensor& a, const at::Tensor& b, at::Tensor& c, float beta);

/// x [..., in] @ weight [out, in]^T (+ bias [out]) -> [..., out], differentiable in x, weight and bias. float32 on
/// the CPU with autocast off: the forward product and the backward's dx = dy W and dW = dy^T x go through nn::mm;
/// everything else is at::linear.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

/// Sum over the N rows of cross_entropy(hidden [N, D] @ weight [V, D]^T, targets [N]) as a float32 scalar, holding at
/// most about `chunk_elements` logits at once: rows go in chunks, and while autograd records, each chunk's
/// gradients for hidden and weight are formed at once from softmax - one_hot, so the backward only scales them by
/// the incoming gradient: no logits are kept or recomputed. Differentiable in hidden and weight. Under bf16
/// autocast the products take bfloat16 operands (as autocast's linear would) and the softmax runs in float32.
/// With `correct`, adds the number of rows whose largest logit is the target (int64 scalar) to *correct.
/// targets: int64 class indices in [0, V) (no ignore index).
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                at::Tensor* correct = nullptr, int64_t chunk_elements = int64_t{1} << 22);

}  // namespace swiftcpp::nn
