// Skrull data scheduling (lib/distributed/skrull.h): plan invariants for every scheduler on many random mixes of each
// LONG_CONTEXT.md distribution (every token once, per-rank memory within budget, nothing longer than the budget kept
// local, chunk pieces together and in order), roll-back, over-budget handling, determinism, planning time, the cost
// model against hand-computed numbers, DeviceProfile JSON, and the modelled ranking at the paper settings.
// No LibTorch. Tolerances: FLOP counts are integers below 2^53 and compared exactly; modelled times derived from
// them through a few divisions compare with EXPECT_DOUBLE_EQ (4 ulp) or a relative 1e-12.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "distributed/skrull.h"

namespace swiftcpp {
namespace {

using skrull::CostModel;
using skrull::DeviceProfile;
using skrull::Distribution;
using skrull::Item;
using skrull::ModelShape;
using skrull::OverBudget;
using skrull::Plan;
using skrull::ScheduleOptions;
using skrull::Scheduler;

const Distribution kDistributions[] = {Distribution::kWikipediaZh, Distribution::kLmsysChat1M,
                                       Distribution::kChatQA2LongSft};

CostModel qwen05b_cost() { return CostModel{ModelShape{896, 2 * 64, 24, 0}, skrull::paper_profile(), false}; }
CostModel llm7b_cost() { return CostModel{ModelShape{3584, 4 * 128, 28, 0}, skrull::paper_profile(), false}; }

ScheduleOptions options(Scheduler s, int64_t dp, int64_t cp, int64_t budget,
                        OverBudget over = OverBudget::kChunk) {
  ScheduleOptions o;
  o.scheduler = s;
  o.dp = dp;
  o.cp = cp;
  o.budget = budget;
  o.over_budget = over;
  return o;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Checks every invariant of a plan independently of the scheduler; returns "" when all hold, else the first
// violation.
std::string check_plan(const Plan& plan, const std::vector<int64_t>& lengths, const ScheduleOptions& o) {
  const int64_t n = o.cp;
  const int64_t c = o.budget;
  const int64_t cap = n * c;
  if (plan.dp != o.dp || plan.cp != n || plan.budget != c) return "plan header differs from the options";
  if (static_cast<int64_t>(plan.ranks.size()) != o.dp) return "wrong number of DP ranks";

  // Items: per sequence, contiguous pieces covering [0, L) (or [0, cap) when truncated), numbered in order.
  std::map<int64_t, std::vector<size_t>> by_seq;
  for (size_t k = 0; k < plan.items.size(); ++k) by_seq[plan.items[k].sequence].push_back(k);
  if (by_seq.size() != lengths.size()) return "not every sequence has items";
  int64_t chunked = 0;
  int64_t truncated = 0;
  for (const auto& [seq, ids] : by_seq) {
    if (seq < 0 || seq >= static_cast<int64_t>(lengths.size())) return "item names an unknown sequence";
    const int64_t len = lengths[static_cast<size_t>(seq)];
    int64_t expect_begin = 0;
    for (size_t p = 0; p < ids.size(); ++p) {
      const Item& it = plan.items[ids[p]];
      if (it.begin != expect_begin) return "pieces of sequence " + std::to_string(seq) + " are not contiguous";
      if (it.piece != static_cast<int32_t>(p) || it.pieces != static_cast<int32_t>(ids.size())) {
        return "piece numbering of sequence " + std::to_string(seq);
      }
      if (it.rows() < 1 || it.rows() > cap) return "an item is empty or longer than the CP group's budget";
      expect_begin = it.end;
    }
    if (len <= cap) {
      if (ids.size() != 1 || expect_begin != len) return "sequence " + std::to_string(seq) + " not whole";
    } else if (o.over_budget == OverBudget::kChunk) {
      if (expect_begin != len || static_cast<int64_t>(ids.size()) != ceil_div(len, cap)) return "bad chunking";
      ++chunked;
    } else {
      if (ids.size() != 1 || expect_begin != cap) return "bad truncation";
      ++truncated;
    }
  }
  if (plan.stats.chunked != chunked || plan.stats.truncated != truncated) return "chunk/truncate stats";
  if (static_cast<int64_t>(plan.notes.size()) != chunked + truncated) return "one note per over-budget sequence";

  // Micro-batches: each item exactly once; recomputed loads match and fit; long items never local.
  std::vector<int> seen(plan.items.size(), 0);
  std::vector<int64_t> item_rank(plan.items.size(), -1);
  std::vector<std::pair<int64_t, int64_t>> where(plan.items.size());  // (dp rank, micro-batch index)
  int64_t local = 0;
  int64_t distributed = 0;
  int64_t micro_batches = 0;
  for (int64_t d = 0; d < o.dp; ++d) {
    const auto& rank = plan.ranks[static_cast<size_t>(d)];
    int64_t tokens = 0;
    for (size_t m = 0; m < rank.micro_batches.size(); ++m) {
      const auto& mb = rank.micro_batches[m];
      if (static_cast<int64_t>(mb.local.size()) != n || static_cast<int64_t>(mb.load.size()) != n) {
        return "micro-batch without N CP ranks";
      }
      std::vector<int64_t> load(static_cast<size_t>(n), 0);
      auto visit = [&](int64_t id) -> std::string {
        if (id < 0 || id >= static_cast<int64_t>(plan.items.size())) return "item id out of range";
        if (seen[static_cast<size_t>(id)]++ != 0) return "item " + std::to_string(id) + " placed twice";
        where[static_cast<size_t>(id)] = {d, static_cast<int64_t>(m)};
        item_rank[static_cast<size_t>(id)] = d;
        tokens += plan.items[static_cast<size_t>(id)].rows();
        return "";
      };
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t id : mb.local[static_cast<size_t>(j)]) {
          if (auto e = visit(id); !e.empty()) return e;
          const int64_t rows = plan.items[static_cast<size_t>(id)].rows();
          if (rows > c) return "an item longer than the rank budget is local";
          load[static_cast<size_t>(j)] += rows;
          ++local;
        }
      }
      for (int64_t id : mb.distributed) {
        if (auto e = visit(id); !e.empty()) return e;
        for (auto& l : load) l += ceil_div(plan.items[static_cast<size_t>(id)].rows(), n);
        ++distributed;
      }
      if (mb.local.empty() && mb.distributed.empty()) return "empty micro-batch";
      for (int64_t j = 0; j < n; ++j) {
        if (load[static_cast<size_t>(j)] != mb.load[static_cast<size_t>(j)]) return "plan load differs";
        if (load[static_cast<size_t>(j)] > c) return "a CP rank is over budget";
      }
      ++micro_batches;
    }
    if (tokens != rank.tokens) return "DP rank token count differs";
  }
  for (size_t k = 0; k < seen.size(); ++k) {
    if (seen[k] != 1) return "item " + std::to_string(k) + " not placed";
  }
  if (plan.stats.local != local || plan.stats.distributed != distributed || plan.stats.micro_batches != micro_batches) {
    return "placement stats differ";
  }

  // Pieces of a chunked sequence: one DP rank, alone in consecutive micro-batches, in order.
  for (const auto& [seq, ids] : by_seq) {
    if (ids.size() < 2) continue;
    for (size_t p = 0; p < ids.size(); ++p) {
      const auto [d, m] = where[ids[p]];
      if (d != where[ids[0]].first || m != where[ids[0]].second + static_cast<int64_t>(p)) {
        return "pieces of sequence " + std::to_string(seq) + " not consecutive on one DP rank";
      }
      const auto& mb = plan.ranks[static_cast<size_t>(d)].micro_batches[static_cast<size_t>(m)];
      size_t count = mb.distributed.size();
      for (const auto& l : mb.local) count += l.size();
      if (count != 1) return "a piece shares its micro-batch";
    }
  }
  return "";
}

TEST(Skrull, EveryItemOnceWithinBudgetForEverySchedulerOnRandomMixes) {
  // Lengths scaled down by 32; budgets small enough that some sequences exceed C and a few exceed C*N.
  const int64_t cps[] = {1, 2, 3, 4, 8};
  const int64_t budgets[] = {48, 200, 512, 1500};
  const CostModel cost = qwen05b_cost();
  int64_t plans = 0, local = 0, distributed = 0, chunked = 0, truncated = 0, raises = 0;
  for (Distribution dist : kDistributions) {
    for (int trial = 0; trial < 40; ++trial) {
      const int64_t count = 1 + (trial * 37) % 160;
      const auto lengths = skrull::sample_lengths(dist, count, 1000 + static_cast<uint64_t>(trial), 32);
      for (Scheduler s : skrull::all_schedulers()) {
        for (bool lookahead : {true, false}) {
          if (!lookahead && s != Scheduler::kSkrull) continue;
          ScheduleOptions o = options(s, 1 + trial % 4, cps[trial % 5], budgets[(trial / 5) % 4],
                                      trial % 3 == 0 ? OverBudget::kTruncate : OverBudget::kChunk);
          o.lookahead = lookahead;
          const Plan plan = skrull::schedule(lengths, o, cost);
          ASSERT_EQ(check_plan(plan, lengths, o), "")
              << skrull::distribution_name(dist) << " trial " << trial << " " << plan.scheduler;
          ++plans;
          local += plan.stats.local;
          distributed += plan.stats.distributed;
          chunked += plan.stats.chunked;
          truncated += plan.stats.truncated;
          raises += plan.stats.gds_raises;
        }
      }
    }
  }
  // The mixes reach every path.
  EXPECT_EQ(plans, 3 * 40 * 6);
  EXPECT_GT(local, 0);
  EXPECT_GT(distributed, 0);
  EXPECT_GT(chunked, 0);
  EXPECT_GT(truncated, 0);
  EXPECT_GT(raises, 0);
}

TEST(Skrull, InvariantsHoldAtPaperScale) {
  const struct {
    CostModel cost;
    int64_t dp, cp, budget;
  } settings[] = {{qwen05b_cost(), 4, 8, 26 * 1024}, {llm7b_cost(), 2, 16, 13 * 1024}};
  for (const auto& st : settings) {
    for (Distribution dist : kDistributions) {
      for (uint64_t seed = 1; seed <= 5; ++seed) {
        const auto lengths = skrull::sample_lengths(dist, 256, seed, 1);
        for (Scheduler s : skrull::all_schedulers()) {
          const ScheduleOptions o = options(s, st.dp, st.cp, st.budget);
          ASSERT_EQ(check_plan(skrull::schedule(lengths, o, st.cost), lengths, o), "")
              << skrull::distribution_name(dist) << " seed " << seed << " " << skrull::scheduler_name(s);
        }
      }
    }
  }
}

TEST(Skrull, SequencesLongerThanTheRankBudgetAreNeverLocal) {
  // One sequence of C + 1 tokens among short ones; on an empty CP group keeping it whole would be cheapest for a
  // rank-local greedy, but no rank can hold it.
  const std::vector<int64_t> lengths = {101, 5, 7, 9};
  for (Scheduler s : skrull::all_schedulers()) {
    const ScheduleOptions o = options(s, 1, 4, 100);
    const Plan plan = skrull::schedule(lengths, o, qwen05b_cost());
    ASSERT_EQ(check_plan(plan, lengths, o), "") << plan.scheduler;
    bool found = false;
    for (const auto& mb : plan.ranks[0].micro_batches) {
      for (int64_t id : mb.distributed) found |= plan.items[static_cast<size_t>(id)].sequence == 0;
    }
    EXPECT_TRUE(found) << plan.scheduler;
  }
}

TEST(Skrull, PaperDacpKeepsEverySequenceThatFitsWhole) {
  // Ascending, least-loaded rank first: 10 -> rank 0, 20 -> rank 1, 30 -> rank 2, 40 -> rank 3.
  const std::vector<int64_t> lengths = {40, 10, 30, 20};
  const ScheduleOptions o = options(Scheduler::kSkrullPaper, 1, 4, 100);
  const Plan plan = skrull::schedule(lengths, o, qwen05b_cost());
  ASSERT_EQ(plan.ranks[0].micro_batches.size(), 1u);
  const auto& mb = plan.ranks[0].micro_batches[0];
  EXPECT_TRUE(mb.distributed.empty());
  const std::vector<int64_t> expect_seq = {1, 3, 2, 0};
  for (size_t j = 0; j < 4; ++j) {
    ASSERT_EQ(mb.local[j].size(), 1u);
    EXPECT_EQ(plan.items[static_cast<size_t>(mb.local[j][0])].sequence, expect_seq[j]) << "rank " << j;
  }
  EXPECT_EQ(mb.load, (std::vector<int64_t>{10, 20, 30, 40}));
}

TEST(Skrull, RollbackOnAConstructedCase) {
  // CP 2, C = 10, lengths 4, 6, 10 (sum 20 = C*N, so GDS starts with one micro-batch). DACP: 4 -> rank 0, 6 ->
  // rank 1; 10 fits no rank whole and needs 5 per rank but rank 1 has 4 free: roll back the 6 (rank 1: 6 -> 3,
  // rank 0: 4 -> 7); now rank 0 has 3 free: roll back the 4 (rank 0: 7 -> 5, rank 1: 3 -> 5); the 10 fits: 10/10.
  const std::vector<int64_t> lengths = {4, 6, 10};
  const ScheduleOptions o = options(Scheduler::kSkrullPaper, 1, 2, 10);
  const Plan plan = skrull::schedule(lengths, o, qwen05b_cost());
  ASSERT_EQ(check_plan(plan, lengths, o), "");
  EXPECT_EQ(plan.stats.rollbacks, 2);
  EXPECT_EQ(plan.stats.gds_raises, 0);
  ASSERT_EQ(plan.ranks[0].micro_batches.size(), 1u);
  const auto& mb = plan.ranks[0].micro_batches[0];
  EXPECT_EQ(mb.distributed, (std::vector<int64_t>{1, 0, 2}));  // rolled back in that order, then the 10
  EXPECT_TRUE(mb.local[0].empty());
  EXPECT_TRUE(mb.local[1].empty());
  EXPECT_EQ(mb.load, (std::vector<int64_t>{10, 10}));

  // Lengths 3, 5, 12 (sum 20, m = 1): 3 -> rank 0, 5 -> rank 1; the 12 needs 6 per rank; rolling back the 5 and
  // then the 3 leaves 5 + 5 (ceil rounding), still too much, and nothing is left to roll back: DACP fails, GDS raises
  // m to 2 ({3, 12} and {5}), where the 12 fits without roll-back. Only accepted micro-batches' roll-backs count.
  const std::vector<int64_t> tight_lengths = {3, 5, 12};
  const Plan raised = skrull::schedule(tight_lengths, o, qwen05b_cost());
  ASSERT_EQ(check_plan(raised, tight_lengths, o), "");
  EXPECT_EQ(raised.stats.gds_raises, 1);
  EXPECT_EQ(raised.stats.rollbacks, 0);
  EXPECT_EQ(raised.ranks[0].micro_batches.size(), 2u);
}

TEST(Skrull, ChatQA2MixesTriggerRollback) {
  int64_t paper = 0;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const auto lengths = skrull::sample_lengths(Distribution::kChatQA2LongSft, 128, seed, 1);
    const ScheduleOptions o = options(Scheduler::kSkrullPaper, 4, 8, 26 * 1024);
    const Plan plan = skrull::schedule(lengths, o, qwen05b_cost());
    ASSERT_EQ(check_plan(plan, lengths, o), "");
    paper += plan.stats.rollbacks;
  }
  EXPECT_GT(paper, 0);
}

TEST(Skrull, PlanningTakesUnderOneMillisecondFor256Sequences) {
  // A smoke bound on an optimised build, not a benchmark: median of 9 runs per case. (bench/skrull_model prints
  // the mean planning time per global batch.)
  for (Scheduler s : {Scheduler::kSkrull, Scheduler::kSkrullPaper}) {
    for (Distribution dist : kDistributions) {
      const auto lengths = skrull::sample_lengths(dist, 256, 42, 1);
      const ScheduleOptions o = options(s, 4, 8, 26 * 1024);
      const CostModel cost = qwen05b_cost();
      std::vector<double> ms;
      for (int run = 0; run < 9; ++run) {
        const auto t0 = std::chrono::steady_clock::now();
        const Plan plan = skrull::schedule(lengths, o, cost);
        const auto t1 = std::chrono::steady_clock::now();
        ASSERT_FALSE(plan.ranks.empty());
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      std::nth_element(ms.begin(), ms.begin() + 4, ms.end());
      EXPECT_LT(ms[4], 1.0) << skrull::scheduler_name(s) << " on " << skrull::distribution_name(dist);
      std::printf("[ timing ] %s on %s, 256 sequences, DP 4 x CP 8: median %.3f ms\n", skrull::scheduler_name(s),
                  skrull::distribution_name(dist), ms[4]);
    }
  }
}

TEST(Skrull, SequencesLongerThanTheGroupBudgetAreChunkedWithANote) {
  // cp 4 x C 1000 = 4000; sequence 1 has 9000 tokens -> 3 pieces (4000, 4000, 1000).
  const std::vector<int64_t> lengths = {300, 9000, 500};
  for (Scheduler s : skrull::all_schedulers()) {
    const ScheduleOptions o = options(s, 2, 4, 1000);
    const Plan plan = skrull::schedule(lengths, o, qwen05b_cost());
    ASSERT_EQ(check_plan(plan, lengths, o), "") << plan.scheduler;
    EXPECT_EQ(plan.stats.chunked, 1);
    ASSERT_EQ(plan.notes.size(), 1u);
    EXPECT_NE(plan.notes[0].find("sequence 1 (9000 tokens) is longer than the CP group's budget 4000"),
              std::string::npos)
        << plan.notes[0];
    EXPECT_NE(plan.notes[0].find("chunked into 3 pieces"), std::string::npos) << plan.notes[0];
    std::vector<std::pair<int64_t, int64_t>> pieces;
    for (const Item& it : plan.items) {
      if (it.sequence == 1) pieces.emplace_back(it.begin, it.end);
    }
    EXPECT_EQ(pieces, (std::vector<std::pair<int64_t, int64_t>>{{0, 4000}, {4000, 8000}, {8000, 9000}}));
  }
}

TEST(Skrull, SequencesLongerThanTheGroupBudgetAreTruncatedWithANote) {
  const std::vector<int64_t> lengths = {300, 9000, 500};
  const ScheduleOptions o = options(Scheduler::kSkrull, 1, 4, 1000, skrull::parse_over_budget("truncate"));
  const Plan plan = skrull::schedule(lengths, o, qwen05b_cost());
  ASSERT_EQ(check_plan(plan, lengths, o), "");
  EXPECT_EQ(plan.stats.truncated, 1);
  EXPECT_EQ(plan.stats.chunked, 0);
  ASSERT_EQ(plan.notes.size(), 1u);
  EXPECT_NE(plan.notes[0].find("sequence 1 (9000 tokens)"), std::string::npos) << plan.notes[0];
  EXPECT_NE(plan.notes[0].find("truncated to 4000 tokens (5000 dropped)"), std::string::npos) << plan.notes[0];
  EXPECT_EQ(plan.items[1].end, 4000);
}

TEST(Skrull, SamePlanForTheSameInput) {
  for (Distribution dist : kDistributions) {
    const auto lengths = skrull::sample_lengths(dist, 200, 7, 8);
    for (Scheduler s : skrull::all_schedulers()) {
      const ScheduleOptions o = options(s, 4, 8, 2000);
      const auto a = skrull::plan_to_json(skrull::schedule(lengths, o, qwen05b_cost())).dump();
      const auto b = skrull::plan_to_json(skrull::schedule(lengths, o, qwen05b_cost())).dump();
      EXPECT_EQ(a, b) << skrull::scheduler_name(s);
    }
  }
  // The generator too; a different seed gives a different batch.
  EXPECT_EQ(skrull::sample_lengths(Distribution::kLmsysChat1M, 50, 3, 1),
            skrull::sample_lengths(Distribution::kLmsysChat1M, 50, 3, 1));
  EXPECT_NE(skrull::sample_lengths(Distribution::kLmsysChat1M, 50, 3, 1),
            skrull::sample_lengths(Distribution::kLmsysChat1M, 50, 4, 1));
}

TEST(Skrull, FlopsFormulaMatchesHandNumbers) {
  // h = 4, h_kv = 2, S = 3: (20*16 + 4*4*2)*3 + 4*4*9 = 1056 + 144 = 1200 per layer forward.
  const ModelShape tiny{4, 2, 2, 0};
  EXPECT_EQ(skrull::layer_forward_flops(tiny, 3, 3), 1200.0);
  EXPECT_EQ(skrull::training_flops(tiny, 3, 3), 3.0 * 2 * 1200);
  // LM head: + 2*h*vocab*rows = 2*4*10*3 = 240 forward.
  EXPECT_EQ(skrull::training_flops(ModelShape{4, 2, 2, 10}, 3, 3), 3.0 * (2 * 1200 + 240));
  // A shard: rows 2 of S = 3 keys: 352*2 + 4*4*2*3 = 800.
  EXPECT_EQ(skrull::layer_forward_flops(tiny, 2, 3), 800.0);
  // Qwen2.5-0.5B-like, S = 1000: (20*896^2 + 4*896*128)*1000 + 4*896*1000^2 = 16515072000 + 3584000000.
  EXPECT_EQ(skrull::layer_forward_flops(ModelShape{896, 128, 24, 0}, 1000, 1000), 20099072000.0);
  // The N shards of a sequence add up to the sequence (when N divides S).
  const ModelShape q{896, 128, 24, 0};
  EXPECT_EQ(8 * skrull::training_flops(q, 1000 / 8, 1000), skrull::training_flops(q, 1000, 1000));
}

TEST(Skrull, ModelledTimesFollowTheStatedFormulas) {
  DeviceProfile p;
  p.efficiency = {{1, 1e6}, {100, 1e8}};
  p.collective_latency_s = 1e-3;
  p.bandwidth_bytes_per_s = 1e3;
  p.bytes_per_element = 2;
  // Linear in log(tokens), clamped outside.
  EXPECT_DOUBLE_EQ(p.flops_per_s(10), 1e6 + 0.5 * (1e8 - 1e6));
  EXPECT_DOUBLE_EQ(p.flops_per_s(0.5), 1e6);
  EXPECT_DOUBLE_EQ(p.flops_per_s(1000), 1e8);
  EXPECT_DOUBLE_EQ(p.flops_per_s(100), 1e8);

  CostModel cost{ModelShape{8, 2, 2, 0}, p, false};
  // comm = layers * 2 * (k * latency + 2 * rows * h_kv * bytes * (N-1)/N / bandwidth):
  // rows 8, N 4: 2*8*2*2*3/4 = 48 bytes -> 0.048 s; 2 * 2 * (0.001 + 0.048) = 0.196.
  EXPECT_NEAR(cost.comm_seconds(8, 1, 4), 0.196, 1e-15);
  EXPECT_NEAR(cost.comm_seconds(8, 3, 4), 0.196, 1e-15);  // shared collective: latency once
  cost.collective_per_sequence = true;
  EXPECT_NEAR(cost.comm_seconds(8, 3, 4), 2 * 2 * (0.003 + 0.048), 1e-15);
  EXPECT_EQ(cost.comm_seconds(8, 3, 1), 0.0);
  EXPECT_EQ(cost.comm_seconds(0, 0, 4), 0.0);
  // local = training FLOPs / flops_per_s(S); shard = FLOPs of ceil(S/N) rows against S keys / flops_per_s(ceil(S/N)).
  EXPECT_DOUBLE_EQ(cost.local_seconds(10, 10), skrull::training_flops(cost.shape, 10, 10) / p.flops_per_s(10));
  EXPECT_DOUBLE_EQ(cost.shard_seconds(10, 10, 4), skrull::training_flops(cost.shape, 3, 10) / p.flops_per_s(3));
}

TEST(Skrull, ModelStepByHand) {
  // h = h_kv = 1, one layer, a flat 1 FLOP/s device (time = FLOPs), 0.5 s per collective, 4 bytes/s, 1-byte K/V.
  DeviceProfile p;
  p.efficiency = {{1, 1.0}};
  p.collective_latency_s = 0.5;
  p.bandwidth_bytes_per_s = 4;
  p.bytes_per_element = 1;
  const CostModel cost{ModelShape{1, 1, 1, 0}, p, false};
  Plan plan;
  plan.dp = 1;
  plan.cp = 2;
  plan.budget = 100;
  plan.items = {Item{0, 0, 4, 0, 1}, Item{1, 0, 3, 0, 1}};
  plan.ranks.resize(1);
  skrull::MicroBatch mb;
  mb.local = {{0}, {}};
  mb.distributed = {1};
  mb.load = {6, 2};
  plan.ranks[0].micro_batches.push_back(mb);
  // local item 0 (S = 4): 3 * ((20+4)*4 + 4*16) = 480. Shard of item 1 (rows 2 of 3): 3 * (24*2 + 4*2*3) = 216.
  // comm: 1 * 2 * (0.5 + 2*3*1*1*(1/2)/4) = 2.5. Rank 0: max(2.5, 480) + 216 = 696; rank 1: max(2.5, 0) + 216.
  const auto step = skrull::model_step(plan, {4, 3}, cost);
  EXPECT_DOUBLE_EQ(step.compute_s[0], 696);
  EXPECT_DOUBLE_EQ(step.compute_s[1], 216);
  EXPECT_DOUBLE_EQ(step.busy_s[0], 696);
  EXPECT_DOUBLE_EQ(step.busy_s[1], 218.5);
  EXPECT_DOUBLE_EQ(step.flops[0], 696);
  EXPECT_DOUBLE_EQ(step.flops[1], 216);
  EXPECT_DOUBLE_EQ(step.step_s, 696);
  EXPECT_DOUBLE_EQ(step.max_compute_s, 696);
  EXPECT_DOUBLE_EQ(step.mean_compute_s, 456);
  // A plan that does not match the lengths is refused.
  EXPECT_THROW(skrull::model_step(plan, {4, 2}, cost), Error);
}

TEST(Skrull, DeviceProfileJsonRoundTrip) {
  DeviceProfile p = skrull::paper_profile();
  p.name = "H200 bf16";
  const auto j = p.to_json();
  const DeviceProfile q = DeviceProfile::from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(q.to_json(), j);
  EXPECT_EQ(q.name, "H200 bf16");
  ASSERT_EQ(q.efficiency.size(), p.efficiency.size());
  for (double t : {1.0, 37.0, 256.0, 5000.0, 1e7}) EXPECT_EQ(q.flops_per_s(t), p.flops_per_s(t));
  EXPECT_EQ(q.collective_latency_s, p.collective_latency_s);
  EXPECT_EQ(q.bandwidth_bytes_per_s, p.bandwidth_bytes_per_s);
  EXPECT_EQ(q.bytes_per_element, p.bytes_per_element);
}

std::string config_error(const nlohmann::json& j) {
  try {
    DeviceProfile::from_json(j, "profile.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Skrull, DeviceProfileJsonErrorsNameTheKey) {
  const auto good = skrull::paper_profile().to_json();
  for (const char* key : {"efficiency", "collective_latency_s", "bandwidth_bytes_per_s", "bytes_per_element"}) {
    auto j = good;
    j.erase(key);
    const std::string e = config_error(j);
    EXPECT_NE(e.find(std::string("'") + key + "' is missing"), std::string::npos) << e;
    EXPECT_NE(e.find("profile.json"), std::string::npos) << e;
  }
  auto unknown = good;
  unknown["bandwith_bytes_per_s"] = 1;
  EXPECT_NE(config_error(unknown).find("unknown key 'bandwith_bytes_per_s'"), std::string::npos);
  auto point = good;
  point["efficiency"][2].erase("flops_per_s");
  EXPECT_NE(config_error(point).find("'efficiency[2].flops_per_s' is missing"), std::string::npos)
      << config_error(point);
  auto mistyped = good;
  mistyped["collective_latency_s"] = "20us";
  EXPECT_NE(config_error(mistyped).find("'collective_latency_s' must be a number"), std::string::npos);
  auto unordered = good;
  std::swap(unordered["efficiency"][0], unordered["efficiency"][1]);
  EXPECT_NE(config_error(unordered).find("strictly ascending"), std::string::npos);
  EXPECT_THROW(DeviceProfile::load("/nonexistent/profile.json"), IoError);
}

TEST(Skrull, BadOptionsThrowConfigError) {
  const CostModel cost = qwen05b_cost();
  const std::vector<int64_t> lengths = {10, 20};
  EXPECT_THROW(skrull::schedule(lengths, options(Scheduler::kSkrull, 0, 1, 100), cost), ConfigError);
  EXPECT_THROW(skrull::schedule(lengths, options(Scheduler::kSkrull, 1, 0, 100), cost), ConfigError);
  EXPECT_THROW(skrull::schedule(lengths, options(Scheduler::kSkrull, 1, 1, 0), cost), ConfigError);
  EXPECT_THROW(skrull::schedule({10, 0}, options(Scheduler::kSkrull, 1, 1, 100), cost), ConfigError);
  EXPECT_THROW(skrull::parse_scheduler("skrul"), ConfigError);
  EXPECT_THROW(skrull::parse_over_budget("drop"), ConfigError);
  EXPECT_THROW(skrull::parse_distribution("wiki"), ConfigError);
  EXPECT_THROW(skrull::sample_lengths(Distribution::kWikipediaZh, 10, 1, 0), ConfigError);
  CostModel no_layers = cost;
  no_layers.shape.layers = 0;
  EXPECT_THROW(skrull::schedule(lengths, options(Scheduler::kSkrull, 1, 1, 100), no_layers), ConfigError);
  for (Scheduler s : skrull::all_schedulers()) EXPECT_EQ(skrull::parse_scheduler(skrull::scheduler_name(s)), s);
  // An empty global batch is not an error: an empty plan, a zero step.
  const Plan empty = skrull::schedule({}, options(Scheduler::kSkrull, 2, 2, 100), cost);
  EXPECT_TRUE(empty.items.empty());
  EXPECT_EQ(skrull::model_step(empty, {}, cost).step_s, 0.0);
  EXPECT_EQ(skrull::parse_scheduler("skrull_paper"), Scheduler::kSkrullPaper);
  try {
    skrull::parse_scheduler("skrul");
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("skrull_paper"), std::string::npos) << e.what();  // lists the valid ones
  }
}

TEST(Skrull, SampledLengthsFollowThePublishedShares) {
  // 20000 draws: a share p has a standard error below 0.0036, so 0.015 is over 4 sigma.
  const struct {
    Distribution d;
    double below_1k, below_32k;
    int64_t longest;
  } cases[] = {{Distribution::kWikipediaZh, 0.8788, 0.9999, 78 * 1024},
               {Distribution::kLmsysChat1M, 0.8712, 0.9998, 1643 * 1024},
               {Distribution::kChatQA2LongSft, 0.2192, 0.9986, 99 * 1024}};
  for (const auto& c : cases) {
    const auto lengths = skrull::sample_lengths(c.d, 20000, 11, 1);
    double below_1k = 0, below_32k = 0;
    for (int64_t l : lengths) {
      ASSERT_GE(l, 32);
      ASSERT_LE(l, c.longest);
      below_1k += l < 1024;
      below_32k += l < 32 * 1024;
    }
    EXPECT_NEAR(below_1k / 20000, c.below_1k, 0.015) << skrull::distribution_name(c.d);
    EXPECT_NEAR(below_32k / 20000, c.below_32k, 0.015) << skrull::distribution_name(c.d);
  }
  // scale divides (rounded, at least 1).
  const auto full = skrull::sample_lengths(Distribution::kChatQA2LongSft, 100, 5, 1);
  const auto scaled = skrull::sample_lengths(Distribution::kChatQA2LongSft, 100, 5, 32);
  for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(scaled[i], std::max<int64_t>(1, (full[i] + 16) / 32));
}

// The paper settings of LONG_CONTEXT.md: 20 global batches of 128 sequences per distribution, paper_profile().
struct PaperSetting {
  const char* name;
  CostModel cost;
  int64_t dp, cp, budget;
};

std::vector<PaperSetting> paper_settings() {
  return {{"0.5B DP4xCP8 C=26K", qwen05b_cost(), 4, 8, 26 * 1024}, {"7B DP2xCP16 C=13K", llm7b_cost(), 2, 16, 13 * 1024}};
}

double mean_step(const PaperSetting& st, Scheduler s, Distribution d, std::vector<double>* per_batch) {
  double sum = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const auto lengths = skrull::sample_lengths(d, 128, seed, 1);
    const Plan plan = skrull::schedule(lengths, options(s, st.dp, st.cp, st.budget), st.cost);
    const double t = skrull::model_step(plan, lengths, st.cost).step_s;
    if (per_batch != nullptr) per_batch->push_back(t);
    sum += t;
  }
  return sum / 20;
}

TEST(Skrull, NeverSlowerThanFlopsBalancedAtPaperSettings) {
  for (const auto& st : paper_settings()) {
    for (Distribution d : kDistributions) {
      std::vector<double> sk, fb;
      mean_step(st, Scheduler::kSkrull, d, &sk);
      mean_step(st, Scheduler::kFlopsBalanced, d, &fb);
      for (size_t b = 0; b < sk.size(); ++b) {
        EXPECT_LE(sk[b], fb[b] * (1 + 1e-12)) << st.name << " " << skrull::distribution_name(d) << " batch " << b;
      }
    }
  }
}

TEST(Skrull, AtLeast1Point5xRoundRobinOnShortHeavyMixesAtPaperSettings) {
  for (const auto& st : paper_settings()) {
    for (Distribution d : {Distribution::kWikipediaZh, Distribution::kLmsysChat1M}) {
      const double rr = mean_step(st, Scheduler::kRoundRobin, d, nullptr);
      const double sk = mean_step(st, Scheduler::kSkrull, d, nullptr);
      EXPECT_GE(rr / sk, 1.5) << st.name << " " << skrull::distribution_name(d);
    }
  }
}

}  // namespace
}  // namespace swiftcpp
