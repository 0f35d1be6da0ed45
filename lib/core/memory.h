// Peak tensor memory per device: on the CPU a counting allocator installed in front of LibTorch's own (every CPU
// tensor LibTorch allocates goes through it; memory-mapped checkpoint tensors do not), on CUDA the caching
// allocator's statistics.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace swiftcpp {

/// Installs the counting CPU allocator once per process (later calls do nothing). Tensors allocated before it
/// are freed correctly but were not counted.
void install_memory_tracking();

/// Bytes of tensor memory allocated now on `device` (0 on the CPU before install_memory_tracking).
int64_t current_memory_bytes(const c10::Device& device);

/// Highest current_memory_bytes since the last reset_peak_memory on `device`.
int64_t peak_memory_bytes(const c10::Device& device);

/// Starts a new peak window: the peak becomes the current allocation.
void reset_peak_memory(const c10::Device& device);

/// The process's peak resident set (getrusage ru_maxrss) in bytes: everything, mapped files included.
int64_t peak_rss_bytes();

/// "peak memory: R MiB resident, T MiB of tensors on DEVICE": resident memory includes the memory-mapped
/// checkpoint pages the process touched; tensor memory counts what LibTorch allocated (packed weights,
/// activations, converted weights), not mapped float weights.
std::string peak_memory_summary(const c10::Device& device);

}  // namespace swiftcpp
