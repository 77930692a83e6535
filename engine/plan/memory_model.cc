#include "plan/memory_model.h"

#include <algorithm>
#include <deque>

#include "kernels/cuda/workspace.h"
#include "model/gpt.h"

namespace gpt {

namespace {

// Gpt::prepare's Carver keeps every tensor 64-byte aligned.
int64_t carved(int64_t n, DType type = DType::kF32) {
  return (n * static_cast<int64_t>(dtype_size(type)) + 63) / 64 * 64;
}

}  // namespace

ActivationBytes activation_bytes(const GptShape& shape, int B, int T, const ActivationCheckpointing& ckpt,
                                 bool fused_attention, DType gemm_inputs, std::optional<DType> compute,
                                 bool fused_gelu_backward, int loss_slots) {
  const int64_t N = static_cast<int64_t>(B) * T, C = shape.n_embd, L = shape.n_layer, V = shape.vocab_size;
  const int64_t att = static_cast<int64_t>(B) * shape.n_head * T * (fused_attention ? 1 : T);
  const DType f32 = DType::kF32, lo = gemm_inputs, out = compute.value_or(gemm_inputs);
  // One block's tensors in carve order: (elements, dtype, cheap: recomputed under `selective`). ln_1, ln_2 and the
  // GELU output are GEMM-only inputs; qkv, the attention output and the fc output are in the compute dtype.
  const struct {
    int64_t n;
    DType type;
    bool cheap;
  } kBlock[] = {{N * C, lo, true},   {N, f32, false},   {N, f32, false},         {3 * N * C, out, false},
                {N * C, out, false}, {att, f32, false}, {N * C, f32, false},     {N * C, lo, true},
                {N, f32, false},     {N, f32, false},   {4 * N * C, out, false}, {4 * N * C, lo, true}};
  auto block = [&](bool all, bool keep_all) {
    int64_t sum = 0;
    for (const auto& t : kBlock) {
      if (all || (keep_all && !(ckpt.selective() && t.cheap))) sum += carved(t.n, t.type);
    }
    return sum;
  };
  const bool any_scratch = ckpt.mode != ActivationCheckpointing::Mode::kNone;
  ActivationBytes a;
  if (any_scratch) a.scratch += block(true, true);
  a.scratch += carved(N * C, out);  // proj_out
  a.stored += carved((L + 1) * N * C);
  for (int l = 0; l < L; ++l) a.stored += block(!any_scratch, !ckpt.recompute_block(l));
  // ln_f out (a GEMM input), mean, rstd; one LM head chunk's logits in the compute dtype, rows padded (and its
  // dlogits where the GEMM input dtype differs, else in place); the losses of loss_slots micro-batches
  const int64_t head = Gpt::head_rows(N) * Gpt::logits_stride(V);
  a.stored += carved(N * C, lo) + 2 * carved(N) + carved(head, out) + (lo == out ? 0 : carved(head, lo)) +
              carved(loss_slots * N);
  a.tokens = 2 * N * 4;  // the int32 inputs and targets, copied to the backend
  // dres, dtmp; the GEMMs' input gradients in the compute dtype: dln, datty and d4 (none under a fused GELU backward,
  // which takes bf16 GEMM inputs and outputs); the gradient at the GELU's input in the GEMM input dtype (in place in
  // d4 where the dtypes agree); dqkv (compute dtype); and dres in bf16 (GEMM inputs in bf16)
  const bool no_d4 = fused_gelu_backward && lo == DType::kBF16 && out == DType::kBF16;
  a.workspace = 2 * carved(N * C) + 2 * carved(N * C, out) + (no_d4 ? 0 : carved(4 * N * C, out)) +
                (!no_d4 && lo == out ? 0 : carved(4 * N * C, lo)) + (lo == f32 ? 0 : carved(N * C, lo)) +
                carved(3 * N * C, out);
  return a;
}

int64_t cuda_backend_workspace_bytes(const GptShape& shape, int B, int T, bool bf16_compute, int64_t local_numel,
                                     int64_t spans) {
  namespace ws = cuda_workspace;
  const ws::ModelDims d{
      B, T, shape.n_embd, shape.n_head, shape.vocab_size, Gpt::head_rows(int64_t{B} * T), shape.dropout > 0.0f};
  // CudaBackend::reserve's areas (cub's sort storage estimated without a GPU); the scratch area grows to the
  // gradient norm's per-tile partials if those are larger; two span tables (AdamW's runs, the master regions),
  // each at most `spans` long.
  const ws::StepAreas a =
      ws::step_areas(d, bf16_compute, ws::embedding_backward_fixed(d.N()) + ws::embedding_sort_estimate(d.N()));
  const int64_t tiles = ws::ceil_div(local_numel, ws::kOptimTile) + spans;
  const size_t scratch = std::max(a.scratch, ws::sum_squares_spans(tiles));
  return static_cast<int64_t>(ws::cublaslt_bytes() + scratch + 2 * ws::span_table(spans)) +
         8 +  // + sum_squares' double
         2 * (a.cast[0] + a.cast[1] + a.cast[2] + a.cast[3]);
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

// A buffer as ShardedParams' pools see it: its size and the category it was allocated under (a pooled
// buffer keeps its first category when reused for something else).
struct Buf {
  int64_t bytes = 0;
  MemCategory category = MemCategory::kWorkspace;
  bool empty() const { return bytes == 0; }
};

// ShardedParams with sizes instead of buffers; every function mirrors its namesake there.
class ShardedParamsSim {
 public:
  ShardedParamsSim(const ModelLayout& layout, const ShardedParamsSetup& setup)
      : s_(setup), u_(unit_sizes(layout, setup.strategy, setup.group_size)), n_(static_cast<int>(u_.numel.size())) {
    gathered_.resize(n_);
    gathered_lo_.resize(n_);
    unit_grads_.resize(n_);
    acquired_.assign(n_, 0);
    alloc(u_.local * 4, MemCategory::kMaster);
    const bool zero12 = s_.strategy == Strategy::kZero1 || s_.strategy == Strategy::kZero2;
    if (!lo_only() && (zero12 || (!shards_optimizer() && lo_params()))) alloc(u_.full * 4, MemCategory::kParams);
    // bf16: zero1/zero2 the gathered parameters (their shards a view of them), zero3 the shards, else the model.
    if (lo_params()) alloc((s_.strategy == Strategy::kZero3 ? u_.local : u_.full) * 2, MemCategory::kParams);
    if (!shards_grads()) alloc(u_.full * 4, MemCategory::kGrads);
    if (shards_optimizer()) alloc(u_.local * 4, MemCategory::kGrads);
  }

  // Trainer: train_step().
  void step(int64_t micro_batches) {
    for (int64_t m = 0; m < micro_batches; ++m) {
      last_micro_ = m + 1 == micro_batches;
      if (m > 0) drain_pending(0);  // ShardedParams::begin_micro_batch
      forward_backward();
    }
    finish_grads();
    publish();
  }
  // Gpt::forward_loss (Trainer::evaluate).
  void forward_loss() {
    forward();
    release(head());
    release(0);
  }
  void publish() {
    if (lo_params() && !shards_optimizer()) return;
    if (s_.strategy != Strategy::kZero1 && s_.strategy != Strategy::kZero2) return;
    for (int u = 0; u < n_; ++u) count(CommOp::kAllGather, u_.padded[u], lo_params() ? 2 : 4);
  }

  void reset_counts() { elements_ = comm_bytes_ = {}; }
  ShardedParamsFigures figures() const {
    ShardedParamsFigures f;
    f.bytes = bytes_;
    f.pooled_bytes = pooled_;
    f.elements = elements_;
    f.comm_bytes = comm_bytes_;
    return f;
  }

 private:
  bool shards_optimizer() const { return s_.strategy >= Strategy::kZero1; }
  bool shards_grads() const { return s_.strategy >= Strategy::kZero2; }
  bool zero3() const { return s_.strategy == Strategy::kZero3; }
  bool lo_params() const { return s_.options.param_dtype == DType::kBF16; }
  bool lo_only() const { return lo_params() && s_.bf16_compute; }
  bool lo_grads() const { return s_.options.reduce_dtype == DType::kBF16; }
  int head() const { return n_ - 1; }

  Buf alloc(int64_t bytes, MemCategory c) {
    bytes_[static_cast<size_t>(c)] += bytes;
    return {bytes, c};
  }
  // Best fit; the first of equal sizes.
  Buf take(std::vector<Buf>& pool, int64_t n, MemCategory c, int64_t elem_bytes) {
    const int64_t want = n * elem_bytes;
    size_t best = pool.size();
    for (size_t i = 0; i < pool.size(); ++i) {
      if (pool[i].bytes >= want && (best == pool.size() || pool[i].bytes < pool[best].bytes)) best = i;
    }
    if (best < pool.size()) {
      const Buf b = pool[best];
      pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(best));
      return b;
    }
    pooled_ += want;
    return alloc(want, c);
  }
  void count(CommOp op, int64_t elements, int64_t elem_bytes) {
    elements_[static_cast<size_t>(op)] += elements;
    comm_bytes_[static_cast<size_t>(op)] += elements * elem_bytes;
  }

  void acquire(int unit) {
    ++acquired_[unit];
    if (!zero3()) return;
    if (unit == ModelLayout::kEmbedUnit) {
      backward_ = false;
      for (int v = 1; v < n_; ++v) {
        if (acquired_[v] == 0 && gathered(v)) free_gathered(v);
      }
    }
    start_gather(unit);
    const int dir = backward_ ? -1 : 1;
    for (int k = 1, v = unit + dir; k <= s_.options.prefetch && v >= 1 && v < n_; ++k, v += dir) start_gather(v);
  }
  bool gathered(int unit) const { return !gathered_[unit].empty() || !gathered_lo_[unit].empty(); }
  void start_gather(int unit) {
    if (gathered(unit)) return;
    if (!lo_only()) gathered_[unit] = take(param_pool_, u_.padded[unit], MemCategory::kParams, 4);
    if (lo_params()) gathered_lo_[unit] = take(lo_pool_, u_.padded[unit], MemCategory::kParams, 2);
    count(CommOp::kAllGather, u_.padded[unit], lo_params() ? 2 : 4);
  }
  void free_gathered(int unit) {
    if (!gathered_[unit].empty()) param_pool_.push_back(gathered_[unit]);
    gathered_[unit] = {};
    if (!gathered_lo_[unit].empty()) lo_pool_.push_back(gathered_lo_[unit]);
    gathered_lo_[unit] = {};
  }
  void release(int unit) {
    if (--acquired_[unit] == 0 && zero3() && (backward_ || s_.options.reshard_after_forward)) free_gathered(unit);
  }
  void grads(int unit) {
    if (!backward_ && zero3()) {
      backward_ = true;
      for (int k = 1, v = head() - 1; k <= s_.options.prefetch && v >= 1; ++k, --v) start_gather(v);
    }
    backward_ = true;
    if (shards_grads() && unit_grads_[unit].empty()) {
      unit_grads_[unit] = take(grad_pool_, u_.padded[unit], MemCategory::kGrads, 4);
    }
  }
  void grads_done(int unit) {
    grads(unit);
    const int64_t rs_bytes = lo_grads() ? 2 : 4;
    switch (s_.strategy) {
      case Strategy::kSingle:
        return;
      case Strategy::kDdp: {
        if (!last_micro_ || s_.group_size == 1) return;
        if (bucket_lo_ >= 0 && unit != bucket_lo_ - 1) flush_bucket();
        if (bucket_lo_ < 0) bucket_hi_ = unit;
        bucket_lo_ = unit;
        if (bucket_numel() * rs_bytes >= s_.options.bucket_bytes || unit == 0) flush_bucket();
        return;
      }
      case Strategy::kZero1: {
        if (!last_micro_) return;
        if (lo_grads()) lo_reduces_.push_back(take(lo_pool_, u_.padded[unit] + u_.shard[unit], MemCategory::kComm, 2));
        count(CommOp::kReduceScatter, u_.padded[unit], rs_bytes);
        return;
      }
      case Strategy::kZero2:
      case Strategy::kZero3: {
        Pending p{unit, unit_grads_[unit], take(shard_pool_, u_.shard[unit], MemCategory::kGrads, 4), {}, {}};
        unit_grads_[unit] = {};
        if (lo_grads()) {
          p.full_lo = take(lo_pool_, u_.padded[unit], MemCategory::kComm, 2);
          p.shard_lo = take(lo_pool_, u_.shard[unit], MemCategory::kComm, 2);
        }
        count(CommOp::kReduceScatter, u_.padded[unit], rs_bytes);
        pending_.push_back(p);
        drain_pending(2);
        return;
      }
    }
  }
  int64_t bucket_numel() const {
    int64_t n = 0;
    for (int v = bucket_lo_; v <= bucket_hi_; ++v) n += u_.numel[v];
    return n;
  }
  void flush_bucket() {
    if (bucket_lo_ < 0) return;
    const int64_t n = bucket_numel();
    bucket_lo_ = bucket_hi_ = -1;
    if (lo_grads()) lo_reduces_.push_back(take(lo_pool_, n, MemCategory::kComm, 2));
    count(CommOp::kAllReduce, n, lo_grads() ? 2 : 4);
  }
  void drain_pending(size_t keep) {
    while (pending_.size() > keep) {
      const Pending& p = pending_.front();
      if (s_.replicas > 1) count(CommOp::kAllReduce, u_.shard[p.unit], lo_grads() ? 2 : 4);
      if (lo_grads()) {
        lo_pool_.push_back(p.full_lo);
        lo_pool_.push_back(p.shard_lo);
      }
      grad_pool_.push_back(p.full);
      shard_pool_.push_back(p.shard);
      pending_.pop_front();
    }
  }
  void finish_grads() {
    flush_bucket();
    for (const Buf& b : lo_reduces_) lo_pool_.push_back(b);
    lo_reduces_.clear();
    drain_pending(0);
  }
  void forward() {
    acquire(0);
    for (int u = 1; u < head(); ++u) {
      acquire(u);
      release(u);
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
    for (int u = head() - 1; u >= 1; --u) {
      acquire(u);
      grads(u);
      grads_done(u);
      release(u);
    }
    grads_done(0);
    release(0);
  }

  struct Pending {
    int unit;
    Buf full, shard, full_lo, shard_lo;
  };
  const ShardedParamsSetup s_;
  const UnitSizes u_;
  const int n_;
  bool backward_ = false, last_micro_ = true;
  int bucket_lo_ = -1, bucket_hi_ = -1;
  std::vector<Buf> gathered_, gathered_lo_, unit_grads_, lo_reduces_;
  std::vector<int> acquired_;
  std::vector<Buf> param_pool_, grad_pool_, shard_pool_, lo_pool_;
  std::deque<Pending> pending_;
  std::array<int64_t, kNumMemCategories> bytes_{};
  int64_t pooled_ = 0;
  std::array<int64_t, kNumCommOps> elements_{}, comm_bytes_{};
};

}  // namespace

ShardedParamsFigures simulate_sharded_params(const ModelLayout& layout, const ShardedParamsSetup& setup,
                                             int64_t micro_batches) {
  ShardedParamsSim sim(layout, setup);
  sim.publish();  // init
  for (int s = 0; s < 2; ++s) {
    sim.step(micro_batches);
    sim.forward_loss();
  }
  sim.step(micro_batches);
  sim.reset_counts();  // a step after a step, not after an eval (which may leave units gathered)
  sim.step(micro_batches);
  return sim.figures();
}

}  // namespace gpt
