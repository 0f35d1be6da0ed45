#include "distributed/skrull.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"

namespace swiftcpp::skrull {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool finite_positive(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Cost model
// ---------------------------------------------------------------------------------------------------------------

void ModelShape::validate() const {
  if (hidden < 1) fail<ConfigError>("model shape: hidden must be at least 1 (got {})", hidden);
  if (kv_hidden < 1) fail<ConfigError>("model shape: kv_hidden must be at least 1 (got {})", kv_hidden);
  if (layers < 1) fail<ConfigError>("model shape: layers must be at least 1 (got {})", layers);
  if (vocab < 0) fail<ConfigError>("model shape: vocab must not be negative (got {})", vocab);
}

double layer_forward_flops(const ModelShape& shape, int64_t rows, int64_t keys) {
  const double h = static_cast<double>(shape.hidden);
  const double hkv = static_cast<double>(shape.kv_hidden);
  const double r = static_cast<double>(rows);
  const double k = static_cast<double>(keys);
  return (20.0 * h * h + 4.0 * h * hkv) * r + 4.0 * h * r * k;
}

double training_flops(const ModelShape& shape, int64_t rows, int64_t keys) {
  double forward = static_cast<double>(shape.layers) * layer_forward_flops(shape, rows, keys);
  if (shape.vocab > 0) {
    forward += 2.0 * static_cast<double>(shape.hidden) * static_cast<double>(shape.vocab) * static_cast<double>(rows);
  }
  return 3.0 * forward;
}

void DeviceProfile::validate() const {
  const std::string who = name.empty() ? std::string("device profile") : fmt::format("device profile '{}'", name);
  if (efficiency.empty()) fail<ConfigError>("{}: 'efficiency' needs at least one point", who);
  for (size_t i = 0; i < efficiency.size(); ++i) {
    const auto& p = efficiency[i];
    if (!finite_positive(p.tokens)) fail<ConfigError>("{}: efficiency[{}].tokens must be > 0 (got {})", who, i, p.tokens);
    if (!finite_positive(p.flops_per_s)) {
      fail<ConfigError>("{}: efficiency[{}].flops_per_s must be > 0 (got {})", who, i, p.flops_per_s);
    }
    if (i > 0 && !(p.tokens > efficiency[i - 1].tokens)) {
      fail<ConfigError>("{}: efficiency tokens must be strictly ascending (efficiency[{}].tokens = {} after {})", who,
                        i, p.tokens, efficiency[i - 1].tokens);
    }
  }
  if (!std::isfinite(collective_latency_s) || collective_latency_s < 0) {
    fail<ConfigError>("{}: collective_latency_s must be >= 0 (got {})", who, collective_latency_s);
  }
  if (!finite_positive(bandwidth_bytes_per_s)) {
    fail<ConfigError>("{}: bandwidth_bytes_per_s must be > 0 (got {})", who, bandwidth_bytes_per_s);
  }
  if (!finite_positive(bytes_per_element)) {
    fail<ConfigError>("{}: bytes_per_element must be > 0 (got {})", who, bytes_per_element);
  }
}

double DeviceProfile::flops_per_s(double tokens) const {
  const auto& e = efficiency;
  if (tokens <= e.front().tokens) return e.front().flops_per_s;
  if (tokens >= e.back().tokens) return e.back().flops_per_s;
  const auto hi = std::upper_bound(e.begin(), e.end(), tokens,
                                   [](double t, const EfficiencyPoint& p) { return t < p.tokens; });
  const auto lo = hi - 1;
  const double f = (std::log(tokens) - std::log(lo->tokens)) / (std::log(hi->tokens) - std::log(lo->tokens));
  return lo->flops_per_s + f * (hi->flops_per_s - lo->flops_per_s);
}

nlohmann::json DeviceProfile::to_json() const {
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : efficiency) points.push_back({{"tokens", p.tokens}, {"flops_per_s", p.flops_per_s}});
  nlohmann::json j = {{"efficiency", points},
                      {"collective_latency_s", collective_latency_s},
                      {"bandwidth_bytes_per_s", bandwidth_bytes_per_s},
                      {"bytes_per_element", bytes_per_element}};
  if (!name.empty()) j["name"] = name;
  if (!source.empty()) j["source"] = source;
  return j;
}

namespace {

// Strict access to one JSON object: every key must be in `allowed`; errors name origin and key path.
class StrictObject {
 public:
  StrictObject(const nlohmann::json& j, std::string origin, std::string path, std::vector<std::string> allowed)
      : j_(j), origin_(std::move(origin)), path_(std::move(path)) {
    if (!j_.is_object()) fail<ConfigError>("{}: {} must be a JSON object, got {}", origin_, where(), j_.type_name());
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        fail<ConfigError>("{}: unknown key '{}' (allowed: {})", origin_, key_path(it.key()), list);
      }
    }
  }

  const nlohmann::json& required(const std::string& key) const {
    if (!j_.contains(key) || j_.at(key).is_null()) {
      fail<ConfigError>("{}: required key '{}' is missing", origin_, key_path(key));
    }
    return j_.at(key);
  }

  double number(const std::string& key) const {
    const auto& v = required(key);
    if (!v.is_number()) fail<ConfigError>("{}: key '{}' must be a number, got {}", origin_, key_path(key), v.dump());
    return v.get<double>();
  }

  std::string optional_string(const std::string& key) const {
    if (!j_.contains(key) || j_.at(key).is_null()) return {};
    const auto& v = j_.at(key);
    if (!v.is_string()) fail<ConfigError>("{}: key '{}' must be a string, got {}", origin_, key_path(key), v.dump());
    return v.get<std::string>();
  }

  std::string key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

 private:
  std::string where() const { return path_.empty() ? std::string("the top level") : "'" + path_ + "'"; }

  const nlohmann::json& j_;
  std::string origin_;
  std::string path_;
};

}  // namespace

DeviceProfile DeviceProfile::from_json(const nlohmann::json& j, const std::string& origin) {
  const StrictObject top(j, origin, "",
                         {"name", "source", "efficiency", "collective_latency_s", "bandwidth_bytes_per_s",
                          "bytes_per_element"});
  DeviceProfile p;
  p.name = top.optional_string("name");
  p.source = top.optional_string("source");
  const auto& points = top.required("efficiency");
  if (!points.is_array()) fail<ConfigError>("{}: key 'efficiency' must be an array, got {}", origin, points.dump());
  for (size_t i = 0; i < points.size(); ++i) {
    const StrictObject point(points[i], origin, fmt::format("efficiency[{}]", i), {"tokens", "flops_per_s"});
    p.efficiency.push_back(EfficiencyPoint{point.number("tokens"), point.number("flops_per_s")});
  }
  p.collective_latency_s = top.number("collective_latency_s");
  p.bandwidth_bytes_per_s = top.number("bandwidth_bytes_per_s");
  p.bytes_per_element = top.number("bytes_per_element");
  try {
    p.validate();
  } catch (const ConfigError& e) {
    fail<ConfigError>("{}: {}", origin, e.what());
  }
  return p;
}

DeviceProfile DeviceProfile::load(const std::string& path) {
  require_regular_file(path, "device profile");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<IoError>("cannot open device profile '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) fail<IoError>("cannot read device profile '{}'", path);
  const nlohmann::json j = parse_json(text.str(), path);  // FormatError naming the file
  return from_json(j, path);
}

DeviceProfile saturating_profile(double peak_flops_per_s, double half_tokens, double bandwidth_bytes_per_s,
                                 double collective_latency_s, double bytes_per_element, const std::string& name) {
  if (!finite_positive(peak_flops_per_s)) fail<ConfigError>("saturating_profile: peak must be > 0");
  if (!finite_positive(half_tokens)) fail<ConfigError>("saturating_profile: half_tokens must be > 0");
  DeviceProfile p;
  p.name = name;
  p.source = fmt::format("synthetic: flops_per_s(t) = {:g} * t / (t + {:g}), sampled at t = 2^0 .. 2^22",
                         peak_flops_per_s, half_tokens);
  for (int k = 0; k <= 22; ++k) {
    const double t = std::ldexp(1.0, k);
    p.efficiency.push_back(EfficiencyPoint{t, peak_flops_per_s * t / (t + half_tokens)});
  }
  p.collective_latency_s = collective_latency_s;
  p.bandwidth_bytes_per_s = bandwidth_bytes_per_s;
  p.bytes_per_element = bytes_per_element;
  p.validate();
  return p;
}

DeviceProfile paper_profile() {
  DeviceProfile p = saturating_profile(400e12, 256, 100e9, 20e-6, 2, "paper constants");
  p.source += "; 100 GB/s, 20 us per collective, bf16 K/V (LONG_CONTEXT.md)";
  return p;
}

void CostModel::validate() const {
  shape.validate();
  device.validate();
}

double CostModel::local_seconds(int64_t rows, int64_t keys) const {
  return training_flops(shape, rows, keys) / device.flops_per_s(static_cast<double>(rows));
}

double CostModel::shard_seconds(int64_t rows, int64_t keys, int64_t cp) const {
  const int64_t r = ceil_div(rows, cp);
  return training_flops(shape, r, keys) / device.flops_per_s(static_cast<double>(r));
}

double CostModel::comm_seconds(int64_t rows, int64_t items, int64_t cp) const {
  if (cp <= 1 || items <= 0) return 0.0;
  const double collectives = collective_per_sequence ? static_cast<double>(items) : 1.0;
  const double n = static_cast<double>(cp);
  const double volume = 2.0 * static_cast<double>(rows) * static_cast<double>(shape.kv_hidden) *
                        device.bytes_per_element * (n - 1.0) / n;  // bytes per rank per collective
  return static_cast<double>(shape.layers) * 2.0 *
         (collectives * device.collective_latency_s + volume / device.bandwidth_bytes_per_s);
}

// ---------------------------------------------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------------------------------------------

nlohmann::json plan_to_json(const Plan& plan) {
  nlohmann::json items = nlohmann::json::array();
  for (const auto& it : plan.items) {
    items.push_back({{"sequence", it.sequence}, {"begin", it.begin}, {"end", it.end}, {"piece", it.piece},
                     {"pieces", it.pieces}});
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : plan.ranks) {
    nlohmann::json mbs = nlohmann::json::array();
    for (const auto& mb : r.micro_batches) {
      mbs.push_back({{"local", mb.local}, {"distributed", mb.distributed}, {"load", mb.load}});
    }
    ranks.push_back({{"micro_batches", mbs}, {"tokens", r.tokens}});
  }
  const auto& s = plan.stats;
  return {{"scheduler", plan.scheduler},
          {"dp", plan.dp},
          {"cp", plan.cp},
          {"budget", plan.budget},
          {"items", items},
          {"ranks", ranks},
          {"notes", plan.notes},
          {"stats",
           {{"micro_batches", s.micro_batches},
            {"local", s.local},
            {"distributed", s.distributed},
            {"rollbacks", s.rollbacks},
            {"gds_raises", s.gds_raises},
            {"chunked", s.chunked},
            {"truncated", s.truncated}}}};
}

// ---------------------------------------------------------------------------------------------------------------
// Schedulers
// ---------------------------------------------------------------------------------------------------------------

namespace {

struct SchedulerName {
  Scheduler value;
  const char* name;
};

constexpr SchedulerName kSchedulerNames[] = {
    {Scheduler::kSkrull, "skrull"},
    {Scheduler::kSkrullPaper, "skrull_paper"},
    {Scheduler::kRoundRobin, "round_robin"},
    {Scheduler::kSorted, "sorted"},
    {Scheduler::kFlopsBalanced, "flops_balanced"},
};

}  // namespace

Scheduler parse_scheduler(const std::string& name) {
  std::string valid;
  for (const auto& s : kSchedulerNames) {
    if (name == s.name) return s.value;
    valid += (valid.empty() ? "" : ", ") + std::string(s.name);
  }
  fail<ConfigError>("unknown scheduler '{}' (valid: {})", name, valid);
}

const char* scheduler_name(Scheduler s) {
  for (const auto& n : kSchedulerNames) {
    if (n.value == s) return n.name;
  }
  return "?";
}

const std::vector<Scheduler>& all_schedulers() {
  static const std::vector<Scheduler> all = {Scheduler::kSkrull, Scheduler::kSkrullPaper, Scheduler::kRoundRobin,
                                             Scheduler::kSorted, Scheduler::kFlopsBalanced};
  return all;
}

OverBudget parse_over_budget(const std::string& name) {
  if (name == "chunk") return OverBudget::kChunk;
  if (name == "truncate") return OverBudget::kTruncate;
  fail<ConfigError>("unknown over_budget '{}' (valid: chunk, truncate)", name);
}

void ScheduleOptions::validate() const {
  if (dp < 1) fail<ConfigError>("skrull: dp must be at least 1 (got {})", dp);
  if (cp < 1) fail<ConfigError>("skrull: cp must be at least 1 (got {})", cp);
  if (budget < 1) fail<ConfigError>("skrull: budget must be at least 1 token (got {})", budget);
  if (budget > std::numeric_limits<int64_t>::max() / cp) {
    fail<ConfigError>("skrull: cp * budget overflows ({} x {})", cp, budget);
  }
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Per-item quantities computed once per schedule() call (the only place the efficiency curve is evaluated).
struct ItemCost {
  int64_t rows = 0;
  int64_t share = 0;     // ceil(rows / N): tokens on each CP rank when distributed
  double local_s = kInf; // modelled time kept whole on one rank; infinite when rows > C
  double shard_s = 0;    // modelled time of one rank's shard when distributed
  double flops = 0;      // training FLOPs of the whole item
  double weight = 0;     // GDS bin-packing weight: rank-seconds of its cheapest admissible placement
};

// A unit the DP-level assignment moves: one item, or the pieces of one chunked sequence.
struct Unit {
  std::vector<int64_t> items;
  bool chunked = false;
};

// One micro-batch being filled.
struct MbState {
  std::vector<std::vector<int64_t>> local;
  std::vector<int64_t> dist;
  std::vector<int64_t> load;
  std::vector<double> tlocal;
  int64_t dist_rows = 0;
  double tdist = 0;
  int64_t rollbacks = 0;

  explicit MbState(int64_t n) : local(static_cast<size_t>(n)), load(static_cast<size_t>(n), 0),
                                tlocal(static_cast<size_t>(n), 0.0) {}
};

class Planner {
 public:
  Planner(const ScheduleOptions& o, const CostModel& cost, std::vector<ItemCost> ic)
      : o_(o), cost_(cost), ic_(std::move(ic)), n_(o.cp), c_(o.budget) {}

  void put_local(MbState& s, int64_t id, size_t j) const {
    s.local[j].push_back(id);
    s.load[j] += ic_[id].rows;
    s.tlocal[j] += ic_[id].local_s;
  }

  void put_distributed(MbState& s, int64_t id) const {
    s.dist.push_back(id);
    for (auto& l : s.load) l += ic_[id].share;
    s.dist_rows += ic_[id].rows;
    s.tdist += ic_[id].shard_s;
  }

  // The CP rank with the fewest free tokens (ties: lowest index).
  size_t fullest(const MbState& s) const {
    size_t r = 0;
    for (size_t j = 1; j < s.load.size(); ++j) {
      if (s.load[j] > s.load[r]) r = j;
    }
    return r;
  }

  // Turns the longest local item on CP rank r that can be rolled back into a distributed one. It can be when it
  // frees tokens on r (rows > ceil(rows/N)) and every other rank still fits after being charged ceil(rows/N).
  // Returns false when no local item on r can be.
  bool roll_back(MbState& s, size_t r) const {
    int64_t best = -1;
    for (int64_t id : s.local[r]) {
      const auto& c = ic_[id];
      if (c.rows - c.share <= 0) continue;
      bool fits = true;
      for (size_t k = 0; k < s.load.size() && fits; ++k) {
        if (k != r && s.load[k] + c.share > c_) fits = false;
      }
      if (!fits) continue;
      if (best < 0 || c.rows > ic_[best].rows || (c.rows == ic_[best].rows && id < best)) best = id;
    }
    if (best < 0) return false;
    auto& list = s.local[r];
    list.erase(std::find(list.begin(), list.end(), best));
    s.load[r] -= ic_[best].rows;
    s.tlocal[r] = 0;  // recomputed rather than subtracted, so it is the same sum a fresh placement gives
    for (int64_t id : list) s.tlocal[r] += ic_[id].local_s;
    put_distributed(s, best);
    ++s.rollbacks;
    return true;
  }

  // DACP as published. Ascending; least local time, then most free tokens; else shard; else roll back.
  bool dacp_paper(std::vector<int64_t> ids, MbState& s) const {
    std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
      return ic_[a].rows != ic_[b].rows ? ic_[a].rows < ic_[b].rows : a < b;
    });
    for (int64_t id : ids) {
      const auto& c = ic_[id];
      for (;;) {
        if (c.rows <= c_) {
          size_t j1 = 0;
          for (size_t j = 1; j < s.load.size(); ++j) {
            if (s.tlocal[j] < s.tlocal[j1] || (s.tlocal[j] == s.tlocal[j1] && s.load[j] < s.load[j1])) j1 = j;
          }
          if (s.load[j1] + c.rows <= c_) {
            put_local(s, id, j1);
            break;
          }
          size_t j2 = 0;
          for (size_t j = 1; j < s.load.size(); ++j) {
            if (s.load[j] < s.load[j2]) j2 = j;
          }
          if (s.load[j2] + c.rows <= c_) {
            put_local(s, id, j2);
            break;
          }
        }
        const size_t r = fullest(s);
        if (s.load[r] + c.share <= c_) {
          put_distributed(s, id);
          break;
        }
        if (!roll_back(s, r)) return false;
      }
    }
    return true;
  }

  // max_j[max(comm, T_local_j)] + T_dist, with rank `changed` (if any) at local time `changed_t`.
  static double objective(const MbState& s, double comm, double tdist, size_t changed, double changed_t) {
    double worst = comm;
    for (size_t j = 0; j < s.tlocal.size(); ++j) worst = std::max(worst, j == changed ? changed_t : s.tlocal[j]);
    return worst + tdist;
  }

  // Cost-aware DACP: longest first; local only when it strictly lowers the micro-batch's modelled time. With
  // look-ahead the local part of the objective is at least (sum_j T_local_j + local time of the items still to be
  // placed) / N: the floor the rest of the micro-batch will reach if it stays local and balanced.
  bool dacp_cost(std::vector<int64_t> ids, MbState& s) const {
    std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
      return ic_[a].rows != ic_[b].rows ? ic_[a].rows > ic_[b].rows : a < b;
    });
    const size_t kNone = std::numeric_limits<size_t>::max();
    const double n = static_cast<double>(n_);
    double later = 0;  // local time of the items after the current one that may be local
    for (int64_t id : ids) {
      if (ic_[id].rows <= c_) later += ic_[id].local_s;
    }
    for (int64_t id : ids) {
      const auto& c = ic_[id];
      if (c.rows <= c_) later = std::max(0.0, later - c.local_s);
      for (;;) {
        const size_t r = fullest(s);
        const bool dist_ok = s.load[r] + c.share <= c_;
        size_t jl = kNone;
        if (c.rows <= c_) {
          for (size_t j = 0; j < s.load.size(); ++j) {
            if (s.load[j] + c.rows > c_) continue;
            if (jl == kNone || s.tlocal[j] < s.tlocal[jl] || (s.tlocal[j] == s.tlocal[jl] && s.load[j] < s.load[jl])) {
              jl = j;
            }
          }
        }
        if (jl != kNone || dist_ok) {
          bool local = jl != kNone;
          if (local && dist_ok) {
            const int64_t n_dist = static_cast<int64_t>(s.dist.size());
            double keep = objective(s, cost_.comm_seconds(s.dist_rows, n_dist, n_), s.tdist, jl,
                                    s.tlocal[jl] + c.local_s);
            double shard = objective(s, cost_.comm_seconds(s.dist_rows + c.rows, n_dist + 1, n_),
                                     s.tdist + c.shard_s, kNone, 0.0);
            if (o_.lookahead) {
              const double placed = std::accumulate(s.tlocal.begin(), s.tlocal.end(), 0.0);
              keep = std::max(keep, (placed + c.local_s + later) / n + s.tdist);
              shard = std::max(shard, (placed + later) / n + s.tdist + c.shard_s);
            }
            local = keep < shard;
          }
          if (local) {
            put_local(s, id, jl);
          } else {
            put_distributed(s, id);
          }
          break;
        }
        if (!roll_back(s, r)) return false;
      }
    }
    return true;
  }

  // Every item sharded; next fit in the given order.
  std::vector<MbState> next_fit(const std::vector<int64_t>& ids) const {
    std::vector<MbState> out;
    for (int64_t id : ids) {
      if (out.empty() || out.back().load[0] + ic_[id].share > c_) out.emplace_back(n_);
      put_distributed(out.back(), id);
    }
    return out;
  }

  // Every item sharded; first fit decreasing by ceil(rows/N).
  std::vector<MbState> first_fit_decreasing(std::vector<int64_t> ids) const {
    std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
      return ic_[a].share != ic_[b].share ? ic_[a].share > ic_[b].share : a < b;
    });
    std::vector<MbState> out;
    for (int64_t id : ids) {
      size_t k = 0;
      while (k < out.size() && out[k].load[0] + ic_[id].share > c_) ++k;
      if (k == out.size()) out.emplace_back(n_);
      put_distributed(out[k], id);
    }
    return out;
  }

  // GDS on one DP rank: ascending order, m = ceil(sum / (C*N)) strided micro-batches, m raised until DACP places
  // all of them.
  std::vector<MbState> gds(std::vector<int64_t> ids, bool paper, int64_t* raises) const {
    if (ids.empty()) return {};
    std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
      return ic_[a].rows != ic_[b].rows ? ic_[a].rows < ic_[b].rows : a < b;
    });
    int64_t total = 0;
    for (int64_t id : ids) total += ic_[id].rows;
    const int64_t count = static_cast<int64_t>(ids.size());
    for (int64_t m = std::max<int64_t>(1, ceil_div(total, c_ * n_));; ++m) {
      std::vector<MbState> mbs;
      bool ok = true;
      for (int64_t j = 0; j < m && j < count && ok; ++j) {
        std::vector<int64_t> slice;
        for (int64_t k = j; k < count; k += m) slice.push_back(ids[static_cast<size_t>(k)]);
        mbs.emplace_back(n_);
        ok = paper ? dacp_paper(std::move(slice), mbs.back()) : dacp_cost(std::move(slice), mbs.back());
      }
      if (ok) return mbs;
      ++*raises;
      // With one item per micro-batch every item fits (ceil(rows/N) <= C), so m never passes the count.
      if (m >= count) fail<Error>("skrull: internal error: GDS could not place {} items with m = {}", count, m);
    }
  }

  // The dedicated micro-batch of one piece of a chunked sequence.
  MbState piece_micro_batch(int64_t id) const {
    MbState s(n_);
    bool ok = true;
    if (o_.scheduler == Scheduler::kSkrull) {
      ok = dacp_cost({id}, s);
    } else if (o_.scheduler == Scheduler::kSkrullPaper) {
      ok = dacp_paper({id}, s);
    } else {
      put_distributed(s, id);
    }
    if (!ok) fail<Error>("skrull: internal error: a piece of {} tokens does not fit its CP group", ic_[id].rows);
    return s;
  }


 private:
  const ScheduleOptions& o_;
  const CostModel& cost_;
  std::vector<ItemCost> ic_;
  int64_t n_;
  int64_t c_;
};

MicroBatch to_micro_batch(MbState&& s) {
  MicroBatch mb;
  mb.local = std::move(s.local);
  mb.distributed = std::move(s.dist);
  mb.load = std::move(s.load);
  return mb;
}

// Longest-processing-time-first assignment of units to `dp` bins by `weight`; ties by first item id, then by the
// lowest bin index. Returns the bin of each unit.
std::vector<int64_t> lpt(const std::vector<Unit>& units, const std::vector<double>& weight, int64_t dp) {
  std::vector<size_t> order(units.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return weight[a] != weight[b] ? weight[a] > weight[b] : units[a].items[0] < units[b].items[0];
  });
  std::vector<double> total(static_cast<size_t>(dp), 0.0);
  std::vector<int64_t> bin(units.size(), 0);
  for (size_t u : order) {
    size_t best = 0;
    for (size_t d = 1; d < total.size(); ++d) {
      if (total[d] < total[best]) best = d;
    }
    bin[u] = static_cast<int64_t>(best);
    total[best] += weight[u];
  }
  return bin;
}

}  // namespace

Plan schedule(const std::vector<int64_t>& lengths, const ScheduleOptions& options, const CostModel& cost) {
  options.validate();
  cost.validate();
  const int64_t n = options.cp;
  const int64_t c = options.budget;
  const int64_t group = n * c;

  Plan plan;
  plan.scheduler = scheduler_name(options.scheduler);
  plan.dp = options.dp;
  plan.cp = n;
  plan.budget = c;
  plan.ranks.resize(static_cast<size_t>(options.dp));

  // Items and units, in sequence order; sequences no CP group holds are chunked or truncated.
  std::vector<Unit> units;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t len = lengths[i];
    if (len < 1) fail<ConfigError>("skrull: sequence {} has {} tokens; every length must be at least 1", i, len);
    const int64_t seq = static_cast<int64_t>(i);
    Unit unit;
    if (len <= group) {
      unit.items.push_back(static_cast<int64_t>(plan.items.size()));
      plan.items.push_back(Item{seq, 0, len, 0, 1});
    } else if (options.over_budget == OverBudget::kChunk) {
      const int64_t pieces = ceil_div(len, group);
      for (int64_t p = 0; p < pieces; ++p) {
        unit.items.push_back(static_cast<int64_t>(plan.items.size()));
        plan.items.push_back(Item{seq, p * group, std::min(len, (p + 1) * group), static_cast<int32_t>(p),
                                  static_cast<int32_t>(pieces)});
      }
      unit.chunked = true;
      ++plan.stats.chunked;
      plan.notes.push_back(fmt::format(
          "sequence {} ({} tokens) is longer than the CP group's budget {} ({} ranks x {} tokens): chunked into {} "
          "pieces of at most {} tokens, to be trained in order as dependent ChunkFlow chunks",
          i, len, group, n, c, pieces, group));
    } else {
      unit.items.push_back(static_cast<int64_t>(plan.items.size()));
      plan.items.push_back(Item{seq, 0, group, 0, 1});
      ++plan.stats.truncated;
      plan.notes.push_back(fmt::format(
          "sequence {} ({} tokens) is longer than the CP group's budget {} ({} ranks x {} tokens): truncated to {} "
          "tokens ({} dropped)",
          i, len, group, n, c, group, len - group));
    }
    units.push_back(std::move(unit));
  }

  std::vector<ItemCost> ic(plan.items.size());
  for (size_t k = 0; k < plan.items.size(); ++k) {
    const Item& it = plan.items[k];
    ItemCost& x = ic[k];
    x.rows = it.rows();
    x.share = ceil_div(x.rows, n);
    x.shard_s = cost.shard_seconds(x.rows, it.end, n);
    x.flops = training_flops(cost.shape, x.rows, it.end);
    if (x.rows <= c) x.local_s = cost.local_seconds(x.rows, it.end);
    x.weight = x.rows <= c ? x.local_s : static_cast<double>(n) * x.shard_s;
  }
  const Planner planner(options, cost, ic);

  // DP assignment of units; `order` is the order in which a DP rank's units are laid out.
  std::vector<int64_t> bin(units.size(), 0);
  std::vector<size_t> order(units.size());
  std::iota(order.begin(), order.end(), size_t{0});
  const Scheduler sched = options.scheduler;
  if (sched == Scheduler::kRoundRobin) {
    for (size_t u = 0; u < units.size(); ++u) bin[u] = static_cast<int64_t>(u) % options.dp;
  } else if (sched == Scheduler::kSorted) {
    std::vector<int64_t> tokens(units.size(), 0);
    for (size_t u = 0; u < units.size(); ++u) {
      for (int64_t id : units[u].items) tokens[u] += ic[id].rows;
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tokens[a] < tokens[b]; });
    const size_t base = units.size() / static_cast<size_t>(options.dp);
    const size_t extra = units.size() % static_cast<size_t>(options.dp);
    size_t k = 0;
    for (size_t d = 0; d < static_cast<size_t>(options.dp); ++d) {
      for (size_t i = 0; i < base + (d < extra ? 1 : 0); ++i) bin[order[k++]] = static_cast<int64_t>(d);
    }
  } else {
    std::vector<double> weight(units.size(), 0.0);
    for (size_t u = 0; u < units.size(); ++u) {
      for (int64_t id : units[u].items) weight[u] += sched == Scheduler::kFlopsBalanced ? ic[id].flops : ic[id].weight;
    }
    bin = lpt(units, weight, options.dp);
  }

  // Per DP rank: micro-batches of its chunked units' pieces first, then the rest.
  for (int64_t d = 0; d < options.dp; ++d) {
    RankPlan& rank = plan.ranks[static_cast<size_t>(d)];
    std::vector<int64_t> rest;
    for (size_t u : order) {
      if (bin[u] != d) continue;
      if (units[u].chunked) {
        for (int64_t id : units[u].items) {
          MbState s = planner.piece_micro_batch(id);
          plan.stats.rollbacks += s.rollbacks;
          rank.micro_batches.push_back(to_micro_batch(std::move(s)));
        }
      } else {
        rest.push_back(units[u].items[0]);
      }
    }
    std::vector<MbState> mbs;
    switch (sched) {
      case Scheduler::kSkrull: mbs = planner.gds(rest, false, &plan.stats.gds_raises); break;
      case Scheduler::kSkrullPaper: mbs = planner.gds(rest, true, &plan.stats.gds_raises); break;
      case Scheduler::kRoundRobin: mbs = planner.next_fit(rest); break;
      case Scheduler::kSorted: mbs = planner.next_fit(rest); break;
      case Scheduler::kFlopsBalanced: mbs = planner.first_fit_decreasing(rest); break;
    }
    for (auto& s : mbs) {
      plan.stats.rollbacks += s.rollbacks;
      rank.micro_batches.push_back(to_micro_batch(std::move(s)));
    }
    for (const auto& mb : rank.micro_batches) {
      for (const auto& list : mb.local) {
        for (int64_t id : list) rank.tokens += ic[id].rows;
        plan.stats.local += static_cast<int64_t>(list.size());
      }
      for (int64_t id : mb.distributed) rank.tokens += ic[id].rows;
      plan.stats.distributed += static_cast<int64_t>(mb.distributed.size());
    }
    plan.stats.micro_batches += static_cast<int64_t>(rank.micro_batches.size());
  }
  return plan;
}

// ---------------------------------------------------------------------------------------------------------------
// Modelled step
// ---------------------------------------------------------------------------------------------------------------

ModelledStep model_step(const Plan& plan, const std::vector<int64_t>& lengths, const CostModel& cost) {
  cost.validate();
  if (plan.dp < 1 || plan.cp < 1 || static_cast<int64_t>(plan.ranks.size()) != plan.dp) {
    fail<Error>("model_step: plan has dp = {}, cp = {} and {} DP ranks", plan.dp, plan.cp, plan.ranks.size());
  }
  for (size_t k = 0; k < plan.items.size(); ++k) {
    const Item& it = plan.items[k];
    if (it.sequence < 0 || it.sequence >= static_cast<int64_t>(lengths.size()) || it.begin < 0 ||
        it.end <= it.begin || it.end > lengths[static_cast<size_t>(it.sequence)]) {
      fail<Error>("model_step: item {} (sequence {}, tokens [{}, {})) does not lie inside the given lengths", k,
                  it.sequence, it.begin, it.end);
    }
  }
  const int64_t n = plan.cp;
  const size_t gpus = static_cast<size_t>(plan.dp * n);
  ModelledStep out;
  out.compute_s.assign(gpus, 0.0);
  out.busy_s.assign(gpus, 0.0);
  out.flops.assign(gpus, 0.0);
  out.dp_time_s.assign(static_cast<size_t>(plan.dp), 0.0);
  auto item = [&](int64_t id) -> const Item& {
    if (id < 0 || id >= static_cast<int64_t>(plan.items.size())) {
      fail<Error>("model_step: item id {} out of range ({} items)", id, plan.items.size());
    }
    return plan.items[static_cast<size_t>(id)];
  };
  for (int64_t d = 0; d < plan.dp; ++d) {
    for (const auto& mb : plan.ranks[static_cast<size_t>(d)].micro_batches) {
      if (static_cast<int64_t>(mb.local.size()) != n) {
        fail<Error>("model_step: a micro-batch of DP rank {} has {} CP ranks, expected {}", d, mb.local.size(), n);
      }
      int64_t dist_rows = 0;
      double tdist = 0;
      double dist_flops = 0;
      for (int64_t id : mb.distributed) {
        const Item& it = item(id);
        dist_rows += it.rows();
        tdist += cost.shard_seconds(it.rows(), it.end, n);
        dist_flops += training_flops(cost.shape, ceil_div(it.rows(), n), it.end);
      }
      const double comm = cost.comm_seconds(dist_rows, static_cast<int64_t>(mb.distributed.size()), n);
      double mb_time = 0;
      for (int64_t j = 0; j < n; ++j) {
        double tlocal = 0;
        double flops = dist_flops;
        for (int64_t id : mb.local[static_cast<size_t>(j)]) {
          const Item& it = item(id);
          tlocal += cost.local_seconds(it.rows(), it.end);
          flops += training_flops(cost.shape, it.rows(), it.end);
        }
        const size_t g = static_cast<size_t>(d * n + j);
        const double busy = std::max(comm, tlocal) + tdist;
        out.compute_s[g] += tlocal + tdist;
        out.busy_s[g] += busy;
        out.flops[g] += flops;
        mb_time = std::max(mb_time, busy);
      }
      out.dp_time_s[static_cast<size_t>(d)] += mb_time;
    }
  }
  out.step_s = *std::max_element(out.dp_time_s.begin(), out.dp_time_s.end());
  out.max_compute_s = *std::max_element(out.compute_s.begin(), out.compute_s.end());
  out.mean_compute_s = std::accumulate(out.compute_s.begin(), out.compute_s.end(), 0.0) / static_cast<double>(gpus);
  return out;
}

ModelledStep model_step(const Plan& plan, const std::vector<int64_t>& lengths, const ModelShape& shape,
                        const DeviceProfile& device, bool collective_per_sequence) {
  return model_step(plan, lengths, CostModel{shape, device, collective_per_sequence});
}

// ---------------------------------------------------------------------------------------------------------------
// Synthetic workloads
// ---------------------------------------------------------------------------------------------------------------

namespace {

struct DistributionSpec {
  Distribution value;
  const char* name;
  double cumulative[6];  // share below 1K, 4K, 8K, 32K, 128K, and up to the longest
  int64_t longest;
};

constexpr int64_t kK = 1024;

constexpr DistributionSpec kDistributions[] = {
    {Distribution::kWikipediaZh, "wikipedia_zh", {0.8788, 0.9934, 0.9992, 0.9999, 1.0, 1.0}, 78 * kK},
    {Distribution::kLmsysChat1M, "lmsys_chat_1m", {0.8712, 0.9935, 0.9987, 0.9998, 0.9999, 1.0}, 1643 * kK},
    {Distribution::kChatQA2LongSft, "chatqa2_long_sft", {0.2192, 0.3148, 0.4043, 0.9986, 1.0, 1.0}, 99 * kK},
};

const DistributionSpec& spec_of(Distribution d) {
  for (const auto& s : kDistributions) {
    if (s.value == d) return s;
  }
  fail<ConfigError>("unknown distribution {}", static_cast<int>(d));
}

// splitmix64: a fixed 64-bit generator whose output is the same everywhere.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 53 random bits.
double unit_double(uint64_t& state) { return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53; }

}  // namespace

Distribution parse_distribution(const std::string& name) {
  std::string valid;
  for (const auto& s : kDistributions) {
    if (name == s.name) return s.value;
    valid += (valid.empty() ? "" : ", ") + std::string(s.name);
  }
  fail<ConfigError>("unknown distribution '{}' (valid: {})", name, valid);
}

const char* distribution_name(Distribution d) { return spec_of(d).name; }

std::vector<int64_t> sample_lengths(Distribution dist, int64_t count, uint64_t seed, int64_t scale) {
  if (count < 0) fail<ConfigError>("sample_lengths: count must not be negative (got {})", count);
  if (scale < 1) fail<ConfigError>("sample_lengths: scale must be at least 1 (got {})", scale);
  const DistributionSpec& spec = spec_of(dist);
  const int64_t edges[7] = {32, kK, 4 * kK, 8 * kK, 32 * kK, 128 * kK, spec.longest + 1};  // [edges[b], edges[b+1])
  uint64_t state = seed;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const double u = unit_double(state);
    int b = 0;
    while (b < 5 && !(u < spec.cumulative[b])) ++b;
    const int64_t lo = edges[b];
    const int64_t hi = std::min(edges[b + 1], spec.longest + 1);  // exclusive
    const double v = unit_double(state);
    const double x = std::exp(std::log(static_cast<double>(lo)) +
                              v * (std::log(static_cast<double>(hi)) - std::log(static_cast<double>(lo))));
    const int64_t len = std::clamp(static_cast<int64_t>(std::floor(x)), lo, hi - 1);
    out.push_back(std::max<int64_t>(1, (len + scale / 2) / scale));
  }
  return out;
}

}  // namespace swiftcpp::skrull
