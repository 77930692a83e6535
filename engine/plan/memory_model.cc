#include "plan/memory_model.h"

#include <algorithm>
#include <deque>

namespace gpt {

namespace {

int64_t carved(int64_t n) { return (n + 15) / 16 * 16; }  // Gpt::prepare's Carver keeps 64-byte alignment

}  // namespace

ActivationElements activation_elements(const GptShape& shape, int B, int T, const ActivationCheckpointing& ckpt) {
  const int64_t N = static_cast<int64_t>(B) * T, C = shape.n_embd, L = shape.n_layer, V = shape.vocab_size;
  const int64_t att = static_cast<int64_t>(B) * shape.n_head * T * T;
  // One block's tensors in carve order: (elements, cheap: recomputed under `selective`).
  const struct {
    int64_t n;
    bool cheap;
  } kBlock[] = {{N * C, true},  {N, false},     {N, false},         {3 * N * C, false},
                {N * C, false}, {att, false},   {N * C, false},     {N * C, true},
                {N, false},     {N, false},     {4 * N * C, false}, {4 * N * C, true}};
  auto block = [&](bool all, bool keep_all) {
    int64_t sum = 0;
    for (const auto& t : kBlock) {
      if (all || (keep_all && !(ckpt.selective() && t.cheap))) sum += carved(t.n);
    }
    return sum;
  };
  const bool any_scratch = ckpt.mode != ActivationCheckpointing::Mode::kNone;
  ActivationElements a;
  if (any_scratch) a.scratch += block(true, true);
  a.scratch += carved(N * C);  // proj_out
  a.stored += carved((L + 1) * N * C);
  for (int l = 0; l < L; ++l) a.stored += block(!any_scratch, !ckpt.recompute_block(l));
  a.stored += carved(N * C) + 2 * carved(N) + carved(N * V) + carved(N);  // ln_f out, mean, rstd; logits; losses
  a.tokens = N;
  a.workspace = 4 * carved(N * C) + carved(4 * N * C) + carved(3 * N * C);
  return a;
}

UnitSizes unit_sizes(const ModelLayout& layout, Strategy strategy, int world_size) {
  UnitSizes s;
  const bool sharded = strategy == Strategy::kZero1 || strategy == Strategy::kZero2 || strategy == Strategy::kZero3;
  for (const UnitLayout& u : layout.units) {
    const int64_t shard = sharded ? (u.numel + world_size - 1) / world_size : u.numel;
    const int64_t padded = sharded ? shard * world_size : u.numel;
    s.numel.push_back(u.numel);
    s.padded.push_back(padded);
    s.shard.push_back(shard);
    s.full += padded;
    s.local += shard;
  }
  return s;
}

namespace {

// ShardedParams' pools with sizes instead of buffers. A pool hands out its first buffer that is large
// enough (in push order) or allocates; allocations are never returned, so `allocated` is the steady size.
struct Pool {
  std::vector<int64_t> free;
  int64_t allocated = 0;
  int64_t take(int64_t n) {
    for (size_t i = 0; i < free.size(); ++i) {
      if (free[i] >= n) {
        const int64_t b = free[i];
        free.erase(free.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
    }
    allocated += n;
    return n;
  }
  void give(int64_t b) { free.push_back(b); }
};

class PoolSim {
 public:
  PoolSim(const UnitSizes& units, int n_layer, Strategy strategy)
      : u_(units), n_layer_(n_layer), zero3_(strategy == Strategy::kZero3) {
    const size_t n = units.numel.size();
    gathered_.assign(n, 0);
    acquired_.assign(n, 0);
    unit_grads_.assign(n, 0);
  }

  void step(int64_t micro_batches) {
    for (int64_t m = 0; m < micro_batches; ++m) forward_backward();
    drain(0);  // finish_grads
  }

  // Gpt::forward_loss (eval).
  void forward_loss() {
    forward();
    release(head());
    release(0);
  }

  PoolElements result() const { return {params_.allocated, grads_.allocated, shards_.allocated}; }

 private:
  struct Pending {
    int64_t full, shard;
  };
  int head() const { return n_layer_ + 1; }

  void acquire(int unit) {
    if (++acquired_[unit] == 1 && zero3_ && gathered_[unit] == 0) gathered_[unit] = params_.take(u_.padded[unit]);
  }
  void release(int unit) {
    if (--acquired_[unit] == 0 && zero3_) {
      params_.give(gathered_[unit]);
      gathered_[unit] = 0;
    }
  }
  void grads(int unit) {
    if (unit_grads_[unit] == 0) unit_grads_[unit] = grads_.take(u_.padded[unit]);
  }
  void grads_done(int unit) {
    grads(unit);
    pending_.push_back({unit_grads_[unit], shards_.take(u_.shard[unit])});
    unit_grads_[unit] = 0;
    drain(2);
  }
  void drain(size_t keep) {
    while (pending_.size() > keep) {
      grads_.give(pending_.front().full);
      shards_.give(pending_.front().shard);
      pending_.pop_front();
    }
  }
  void forward() {
    acquire(0);
    for (int l = 0; l < n_layer_; ++l) {
      acquire(1 + l);
      release(1 + l);
    }
    acquire(head());
  }
  // Gpt::forward_backward.
  void forward_backward() {
    forward();
    grads(0);
    grads(head());
    grads_done(head());
    release(head());
    for (int l = n_layer_ - 1; l >= 0; --l) {
      acquire(1 + l);
      grads(1 + l);
      grads_done(1 + l);
      release(1 + l);
    }
    grads_done(0);
    release(0);
  }

  const UnitSizes& u_;
  int n_layer_;
  bool zero3_;
  Pool params_, grads_, shards_;
  std::vector<int64_t> gathered_, unit_grads_;
  std::vector<int> acquired_;
  std::deque<Pending> pending_;
};

}  // namespace

PoolElements simulate_pools(const UnitSizes& units, int n_layer, Strategy strategy, int64_t micro_batches) {
  if (strategy != Strategy::kZero2 && strategy != Strategy::kZero3) return {};
  PoolSim sim(units, n_layer, strategy);
  // The pools' contents repeat after a couple of micro-batches; more would change nothing.
  const int64_t m = std::clamp<int64_t>(micro_batches, 1, 4);
  sim.step(m);
  sim.forward_loss();
  sim.step(m);
  return sim.result();
}

}  // namespace gpt
