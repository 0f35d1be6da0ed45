#include "data/collate.h"

#include <ATen/ATen.h>
#include <tuple>

#include <algorithm>
#include <numeric>
#include <set>

#include <fmt/ranges.h>

#include "core/error.h"

namespace swiftcpp {

int64_t Sample::label_tokens() const {
  return std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l != kIgnoreIndex; });
}

std::vector<TokenSpan> image_token_runs(const std::vector<int32_t>& ids, const ImageTokenLayout& layout) {
  if (layout.per_image < 1) fail<ConfigError>("image tokens per image must be at least 1, got {}", layout.per_image);
  std::vector<TokenSpan> runs;
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t t = 0; t < n;) {
    if (ids[static_cast<size_t>(t)] != layout.id) {
      ++t;
      continue;
    }
    int64_t end = t;
    while (end < n && ids[static_cast<size_t>(end)] == layout.id) ++end;
    if ((end - t) % layout.per_image != 0) {
      fail<ConfigError>("{} image tokens (id {}) at positions [{}, {}) are not a whole number of images of {} tokens",
                        end - t, layout.id, t, end, layout.per_image);
    }
    for (; t < end; t += layout.per_image) runs.push_back({t, t + layout.per_image});
  }
  return runs;
}

std::vector<TokenSpan> image_token_runs(const std::vector<int32_t>& ids, int32_t id, const std::vector<int64_t>& counts) {
  std::vector<TokenSpan> runs;
  const int64_t n = static_cast<int64_t>(ids.size());
  size_t image = 0;
  for (int64_t t = 0; t < n;) {
    if (ids[static_cast<size_t>(t)] != id) {
      ++t;
      continue;
    }
    if (image >= counts.size()) {
      fail<ConfigError>("image tokens (id {}) at position {} beyond the {} image(s) of the sample", id, t, counts.size());
    }
    const int64_t end = t + counts[image];
    for (int64_t k = t; k < end; ++k) {
      if (k >= n || ids[static_cast<size_t>(k)] != id) {
        fail<ConfigError>("image {} takes {} tokens (id {}) from position {}, but the run ends at {}", image,
                          counts[image], id, t, k);
      }
    }
    runs.push_back({t, end});
    t = end;
    ++image;
  }
  if (image != counts.size()) {
    fail<ConfigError>("the sample holds {} image-token run(s) (id {}) for {} image(s)", image, id, counts.size());
  }
  return runs;
}

at::Tensor stack_pixel_values(const std::vector<const Sample*>& samples) {
  std::vector<at::Tensor> images;
  for (const Sample* s : samples) images.insert(images.end(), s->pixel_values.begin(), s->pixel_values.end());
  if (images.empty()) return {};
  for (size_t i = 0; i < images.size(); ++i) {
    TORCH_CHECK(images[i].dim() == 3, "pixel_values of a sample must be [C, H, W], got ", images[i].sizes());
    if (images[i].sizes() != images[0].sizes()) {
      fail<ConfigError>("images of different sizes in one batch: image 0 is [{}] and image {} is [{}]; the image "
                        "processor must give every image one size (crop_size)",
                        fmt::join(images[0].sizes(), ", "), i, fmt::join(images[i].sizes(), ", "));
    }
  }
  return at::stack(images).to(at::kFloat);  // [N, C, H, W]
}

ImageInputs batch_images(const std::vector<const Sample*>& samples) {
  std::vector<at::Tensor> rows;
  std::vector<int64_t> grids;
  size_t images = 0, with_grid = 0;
  for (const Sample* s : samples) {
    images += s->pixel_values.size();
    with_grid += s->image_grids.size();
    if (s->image_grids.empty()) continue;
    TORCH_CHECK(s->image_grids.size() == s->pixel_values.size(), "a sample's image grids do not match its images");
    rows.insert(rows.end(), s->pixel_values.begin(), s->pixel_values.end());
    for (const auto& g : s->image_grids) grids.insert(grids.end(), g.begin(), g.end());
  }
  if (with_grid == 0) return {stack_pixel_values(samples), at::Tensor()};
  if (with_grid != images) {
    fail<ConfigError>("fixed-size and variable-size images in one batch ({} of {} images have grids)", with_grid, images);
  }
  return {at::cat(rows, 0).to(at::kFloat),  // [sum of patches, C T P P]
          at::tensor(grids, at::kLong).view({static_cast<int64_t>(with_grid), 3})};
}

Batch collate_padded(const std::vector<const Sample*>& samples, int32_t pad_id) {
  std::vector<std::vector<const Sample*>> rows;
  for (const Sample* s : samples) rows.push_back({s});
  Batch batch = collate_packed(rows, pad_id);
  batch.segment_ids = at::Tensor();  // one sample per row: padding masks suffice
  return batch;
}

std::vector<std::vector<size_t>> pack_best_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity) {
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<size_t>> rows;
  std::multiset<std::pair<int64_t, size_t>> room;  // (free tokens, row)
  for (size_t i : order) {
    if (lengths[i] > capacity) {
      fail<ConfigError>("a sample of {} tokens does not fit a packed row of {} (max_length)", lengths[i], capacity);
    }
    auto it = room.lower_bound({lengths[i], 0});
    if (it == room.end()) {
      rows.push_back({i});
      room.insert({capacity - lengths[i], rows.size() - 1});
    } else {
      const auto [free, row] = *it;
      room.erase(it);
      rows[row].push_back(i);
      room.insert({free - lengths[i], row});
    }
  }
  return rows;
}

Batch collate_packed(const std::vector<std::vector<const Sample*>>& rows, int32_t pad_id) {
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t T = 0;
  for (const auto& row : rows) {
    int64_t n = 0;
    for (const Sample* s : row) n += static_cast<int64_t>(s->input_ids.size());
    T = std::max(T, n);
  }
  Batch batch;
  batch.input_ids = at::full({B, T}, pad_id, at::kLong);
  batch.labels = at::full({B, T}, kIgnoreIndex, at::kLong);
  batch.position_ids = at::zeros({B, T}, at::kLong);
  batch.segment_ids = at::full({B, T}, -1, at::kLong);
  at::Tensor valid = at::zeros({B, T}, at::kBool);
  auto ids = batch.input_ids.accessor<int64_t, 2>();
  auto labels = batch.labels.accessor<int64_t, 2>();
  auto pos = batch.position_ids.accessor<int64_t, 2>();
  auto seg = batch.segment_ids.accessor<int64_t, 2>();
  auto ok = valid.accessor<bool, 2>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0;
    for (size_t k = 0; k < rows[b].size(); ++k) {
      const Sample& s = *rows[b][k];
      TORCH_CHECK(s.labels.size() == s.input_ids.size(), "sample labels and input_ids differ in length");
      for (size_t j = 0; j < s.input_ids.size(); ++j, ++t) {
        ids[b][t] = s.input_ids[j];
        labels[b][t] = s.labels[j];
        pos[b][t] = static_cast<int64_t>(j);
        seg[b][t] = static_cast<int64_t>(k);
        ok[b][t] = true;
      }
      batch.label_tokens += s.label_tokens();
      batch.real_tokens += static_cast<int64_t>(s.input_ids.size());
    }
  }
  if (batch.real_tokens < B * T) batch.key_valid = valid;
  std::vector<const Sample*> in_order;  // rows first, then each row's samples as concatenated
  for (const auto& row : rows) in_order.insert(in_order.end(), row.begin(), row.end());
  ImageInputs images = batch_images(in_order);
  batch.pixel_values = std::move(images.pixel_values);
  batch.image_grid_thw = std::move(images.image_grid_thw);
  return batch;
}

at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
  // logits: [B, T, V], labels: [B, T]
  const at::Tensor flat = logits.reshape({-1, logits.size(-1)});
  const at::Tensor wide = flat.scalar_type() == at::kDouble ? flat : flat.to(at::kFloat);
  return at::cross_entropy_loss(wide, labels.reshape({-1}).to(logits.device()), {}, at::Reduction::Sum, kIgnoreIndex);
}

}  // namespace swiftcpp
