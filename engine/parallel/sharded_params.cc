#include "parallel/sharded_params.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace gpt {

Expected<Strategy> parse_strategy(std::string_view name) {
  if (name == "single") return Strategy::kSingle;
  if (name == "ddp") return Strategy::kDdp;
  if (name == "zero1") return Strategy::kZero1;
  if (name == "zero2") return Strategy::kZero2;
  if (name == "zero3") return Strategy::kZero3;
  return Status::invalid_argument("expected one of single|ddp|zero1|zero2|zero3, got '" + std::string(name) + "'");
}

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kSingle:
      return "single";
    case Strategy::kDdp:
      return "ddp";
    case Strategy::kZero1:
      return "zero1";
    case Strategy::kZero2:
      return "zero2";
    case Strategy::kZero3:
      return "zero3";
  }
  return "?";
}

ShardedParams::ShardedParams(const ModelLayout& layout, Backend& backend, Communicator& group, Strategy strategy,
                             Communicator* replicas, ShardingOptions options, Communicator* host_group)
    : layout_(layout),
      be_(backend),
      group_(group),
      replicas_(replicas != nullptr && replicas->size() > 1 ? replicas : nullptr),
      host_group_(host_group != nullptr ? *host_group : group),
      strategy_(strategy),
      options_(options),
      rank_(group.rank()),
      size_(group.size()),
      lo_only_(options.param_dtype == DType::kBF16 && backend.compute_dtype() == DType::kBF16) {
  GPT_CHECK(strategy != Strategy::kSingle || size_ == 1);
  GPT_CHECK(host_group_.size() == size_ && host_group_.rank() == rank_);
  GPT_CHECK_MSG(replicas_ == nullptr || strategy >= Strategy::kZero2, "replicate groups need zero2 or zero3");
  const int n = static_cast<int>(layout.units.size());
  const bool zero12 = strategy_ == Strategy::kZero1 || strategy_ == Strategy::kZero2;
  int64_t model_index = 0;  // the unit's first element in the whole model's flat parameters
  for (int u = 0; u < n; ++u) {
    UnitInfo info;
    info.numel = layout.units[u].numel;
    if (shards_optimizer()) {
      info.shard = (info.numel + size_ - 1) / size_;
      info.padded = info.shard * size_;
    } else {
      info.shard = info.padded = info.numel;
    }
    info.local_offset = local_numel_;
    info.full_offset = full_numel_;
    const int64_t begin = shards_optimizer() ? rank_ * info.shard : 0;
    // bf16 zero1/zero2: the bf16 shard is this rank's block of the gathered parameters (all-gathered in place).
    const int64_t lo_shift = lo_params() && zero12 ? info.full_offset + begin - info.local_offset : 0;
    regions_.push_back({u, begin, std::clamp<int64_t>(info.numel - begin, 0, info.shard), info.local_offset, lo_shift});
    region_spans_.push_back(
        {info.local_offset, regions_.back().length, static_cast<uint64_t>(model_index + begin), false, lo_shift});
    model_index += info.numel;
    local_numel_ += info.shard;
    full_numel_ += info.padded;
    units_.push_back(info);
  }
  master_ = be_.alloc(local_numel_ * sizeof(float), MemCategory::kMaster);
  // Full fp32 compute parameters: zero1/zero2, and single/ddp with bf16 parameters (else they are the master
  // weights); none when the parameters are bf16 only (bf16 compute).
  if (!lo_only_ && (zero12 || (!shards_optimizer() && lo_params()))) {
    params_full_ = be_.alloc(full_numel_ * sizeof(float), MemCategory::kParams);
  }
  if (lo_params()) {
    // zero1/zero2: the gathered bf16 parameters (the compute parameters themselves when bf16 only), which hold the
    // rank's bf16 shard too (as DeepSpeed's bit16 partitions are views of its flat bit16 buffer); else the bf16
    // copy of the master buffer.
    if (zero12) {
      params_full_lo_ = be_.alloc(full_numel_ * sizeof(bf16), MemCategory::kParams);
    } else {
      param_shard_lo_ =
          be_.alloc((shards_optimizer() ? local_numel_ : full_numel_) * sizeof(bf16), MemCategory::kParams);
    }
  }
  if (!shards_grads()) grads_full_ = be_.alloc(full_numel_ * sizeof(float), MemCategory::kGrads);
  if (shards_optimizer()) grads_shard_ = be_.alloc(local_numel_ * sizeof(float), MemCategory::kGrads);
  local_grads_ = shards_optimizer() ? grads_shard_.as<float>() : grads_full_.as<float>();
  gathered_.resize(n);
  gathered_lo_.resize(n);
  expanded_.assign(n, false);
  gather_work_.resize(n);
  unit_grads_.resize(n);
  acquired_.assign(n, 0);
}

ShardedParams::~ShardedParams() {
  for (Work& w : gather_work_) w.wait();
  for (Work& w : grad_works_) w.wait();
  for (GradReduce& r : lo_reduces_) r.work.wait();
  for (Pending& p : pending_) p.work.wait();
  be_.synchronize();  // and the collectives joined on the device, before the pools' buffers are freed
}

Buffer ShardedParams::take(std::vector<Buffer>& pool, int64_t n, MemCategory category, size_t elem_bytes) {
  // Best fit, so a small request never takes the one buffer a large unit (the embedding) needs and the
  // pools settle after the first step at one buffer per unit size in use at once.
  const size_t bytes = static_cast<size_t>(n) * elem_bytes;
  size_t best = pool.size();
  for (size_t i = 0; i < pool.size(); ++i) {
    if (pool[i].bytes() >= bytes && (best == pool.size() || pool[i].bytes() < pool[best].bytes())) best = i;
  }
  if (best < pool.size()) {
    Buffer b = std::move(pool[best]);
    pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(best));
    return b;
  }
  return be_.alloc(bytes, category);
}

void ShardedParams::init(const GptShape& shape, uint64_t seed) {
  std::vector<float> host;  // staging when the master weights live on a device
  for (const MasterRegion& r : regions_) {
    const int64_t n = units_[r.unit].shard;
    float* dst = master() + r.local_offset;
    if (!be_.host_memory()) {
      host.assign(n, 0.0f);
      dst = host.data();
    }
    std::fill(dst, dst + n, 0.0f);
    if (r.length > 0) init_unit_slice(layout_.units[r.unit], shape, seed, r.begin, r.begin + r.length, dst);
    if (!be_.host_memory()) be_.to_device(master() + r.local_offset, dst, n * sizeof(float));
  }
  publish(/*step=*/0);
}

ConstTensorPtr ShardedParams::acquire(int unit) {
  GPT_CHECK_MSG(lo_only_ == (lo_params() && be_.compute_dtype() == DType::kBF16),
                "ShardedParams: the backend's compute dtype changed after construction");
  const UnitInfo& u = units_[unit];
  ++acquired_[unit];
  switch (strategy_) {
    case Strategy::kSingle:
    case Strategy::kDdp:
      if (lo_only_) return param_shard_lo_.as<bf16>() + u.local_offset;
      return lo_params() ? params_full_.as<float>() + u.full_offset : master() + u.local_offset;
    case Strategy::kZero1:
    case Strategy::kZero2:
      if (lo_only_) return params_full_lo_.as<bf16>() + u.full_offset;
      return params_full_.as<float>() + u.full_offset;
    case Strategy::kZero3:
      break;
  }
  const int last = static_cast<int>(units_.size()) - 1;
  if (unit == ModelLayout::kEmbedUnit) {
    // A new pass: drop anything a previous forward-only pass kept (reshard_after_forward: false).
    backward_ = false;
    for (int v = 1; v <= last; ++v) {
      if (acquired_[v] == 0 && gathered(v)) free_gathered(v);
    }
  }
  start_gather(unit);
  gather_work_[unit].join();
  if (lo_params() && !lo_only_ && !expanded_[unit]) {  // computed through fp32
    be_.cast_from_bf16(gathered_[unit].as<float>(), gathered_lo_[unit].as<bf16>(), u.padded);
    expanded_[unit] = true;
  }
  // Prefetch the next blocks in pass order (the embed unit is held for the whole pass).
  const int step = backward_ ? -1 : 1;
  for (int k = 1, v = unit + step; k <= options_.prefetch && v >= 1 && v <= last; ++k, v += step) start_gather(v);
  if (lo_only_) return gathered_lo_[unit].as<bf16>();
  return gathered_[unit].as<float>();
}

bool ShardedParams::gathered(int unit) const { return !gathered_[unit].empty() || !gathered_lo_[unit].empty(); }

void ShardedParams::start_gather(int unit) {
  if (gathered(unit)) return;
  const UnitInfo& u = units_[unit];
  if (!lo_only_) gathered_[unit] = take(param_pool_, u.padded, MemCategory::kParams);
  if (lo_params()) {
    gathered_lo_[unit] = take(lo_pool_, u.padded, MemCategory::kParams, sizeof(bf16));
    expanded_[unit] = false;
    gather_work_[unit] = group_.all_gather(param_shard_lo_.as<bf16>() + u.local_offset, gathered_lo_[unit].as<bf16>(),
                                           u.shard, DType::kBF16);
  } else {
    gather_work_[unit] =
        group_.all_gather(master() + u.local_offset, gathered_[unit].as<float>(), u.shard, DType::kF32);
  }
}

void ShardedParams::free_gathered(int unit) {
  gather_work_[unit].join();  // the buffer may still be arriving
  if (!gathered_[unit].empty()) param_pool_.push_back(std::move(gathered_[unit]));
  if (!gathered_lo_[unit].empty()) lo_pool_.push_back(std::move(gathered_lo_[unit]));
}

void ShardedParams::release(int unit) {
  GPT_CHECK(acquired_[unit] > 0);
  if (--acquired_[unit] == 0 && strategy_ == Strategy::kZero3 && (backward_ || options_.reshard_after_forward)) {
    free_gathered(unit);
  }
}

float* ShardedParams::grads(int unit) {
  const UnitInfo& u = units_[unit];
  if (!backward_ && strategy_ == Strategy::kZero3) {
    // Backward starts (at the LM head): prefetch the last blocks, which backward needs next.
    backward_ = true;
    const int head = static_cast<int>(units_.size()) - 1;
    for (int k = 1, v = head - 1; k <= options_.prefetch && v >= 1; ++k, --v) start_gather(v);
  }
  backward_ = true;
  if (!shards_grads()) return grads_full_.as<float>() + u.full_offset;
  if (unit_grads_[unit].empty()) {
    unit_grads_[unit] = take(grad_pool_, u.padded, MemCategory::kGrads);
    be_.fill_zero(unit_grads_[unit].as<float>(), u.padded);
  }
  return unit_grads_[unit].as<float>();
}

void ShardedParams::grads_done(int unit) {
  const UnitInfo& u = units_[unit];
  float* full = grads(unit);
  switch (strategy_) {
    case Strategy::kSingle:
      return;
    case Strategy::kDdp: {
      if (!last_micro_ || size_ == 1) return;
      // Backward finishes units in descending order, which are adjacent in the flat buffer: a bucket grows
      // downwards until it holds bucket_bytes, and is launched then (or when the order breaks).
      if (bucket_lo_ >= 0 && unit != bucket_lo_ - 1) flush_bucket();
      if (bucket_lo_ < 0) bucket_hi_ = unit;
      bucket_lo_ = unit;
      const int64_t n = units_[bucket_hi_].full_offset + units_[bucket_hi_].numel - units_[bucket_lo_].full_offset;
      const int64_t elem = lo_grads() ? 2 : 4;
      if (n * elem >= options_.bucket_bytes || unit == 0) flush_bucket();
      return;
    }
    case Strategy::kZero1: {
      if (!last_micro_) return;
      float* dst = grads_shard_.as<float>() + u.local_offset;
      if (!lo_grads()) {
        grad_works_.push_back(group_.reduce_scatter(full, dst, u.shard, DType::kF32));
        return;
      }
      // bf16 reduction: send the unit's gradient as bf16; the result is cast back to fp32 in finish_grads.
      GradReduce r{Work(), take(lo_pool_, u.padded + u.shard, MemCategory::kComm, sizeof(bf16)), nullptr, dst, u.shard};
      bf16* lo = r.lo.as<bf16>();
      be_.cast_to_bf16(lo, full, u.padded);
      r.work = group_.reduce_scatter(lo, lo + u.padded, u.shard, DType::kBF16);
      r.result = lo + u.padded;
      lo_reduces_.push_back(std::move(r));
      return;
    }
    case Strategy::kZero2:
    case Strategy::kZero3: {
      Pending p{Work(),   unit,    std::move(unit_grads_[unit]), take(shard_pool_, u.shard, MemCategory::kGrads),
                Buffer(), Buffer()};
      if (lo_grads()) {
        p.full_lo = take(lo_pool_, u.padded, MemCategory::kComm, sizeof(bf16));
        p.shard_lo = take(lo_pool_, u.shard, MemCategory::kComm, sizeof(bf16));
        be_.cast_to_bf16(p.full_lo.as<bf16>(), p.full.as<float>(), u.padded);
        p.work = group_.reduce_scatter(p.full_lo.as<bf16>(), p.shard_lo.as<bf16>(), u.shard, DType::kBF16);
      } else {
        p.work = group_.reduce_scatter(p.full.as<float>(), p.shard.as<float>(), u.shard, DType::kF32);
      }
      pending_.push_back(std::move(p));
      drain_pending(2);  // bound the gradient buffers in flight
      return;
    }
  }
}

void ShardedParams::flush_bucket() {
  if (bucket_lo_ < 0) return;
  const int64_t offset = units_[bucket_lo_].full_offset;
  const int64_t n = units_[bucket_hi_].full_offset + units_[bucket_hi_].numel - offset;
  bucket_lo_ = bucket_hi_ = -1;
  float* full = grads_full_.as<float>() + offset;
  if (!lo_grads()) {
    grad_works_.push_back(group_.all_reduce(full, n, DType::kF32));
    return;
  }
  // bf16 reduction in place in a bf16 copy; cast back to fp32 in finish_grads.
  GradReduce r{Work(), take(lo_pool_, n, MemCategory::kComm, sizeof(bf16)), nullptr, full, n};
  be_.cast_to_bf16(r.lo.as<bf16>(), full, n);
  r.work = group_.all_reduce(r.lo.as<bf16>(), n, DType::kBF16);
  r.result = r.lo.as<bf16>();
  lo_reduces_.push_back(std::move(r));
}

// Completes the oldest reduce-scatters until at most `keep` are in flight: adds each shard into the
// accumulator (in issue order, so the sum is deterministic) and returns its buffers to the pools.
void ShardedParams::drain_pending(size_t keep) {
  while (pending_.size() > keep) {
    Pending& p = pending_.front();
    p.work.join();
    const int64_t n = units_[p.unit].shard;
    // Hybrid: the in-group sum becomes the global sum across replicas.
    if (replicas_ != nullptr) {
      if (lo_grads()) {
        replicas_->all_reduce(p.shard_lo.as<bf16>(), n, DType::kBF16).join();
      } else {
        replicas_->all_reduce(p.shard.as<float>(), n, DType::kF32).join();
      }
    }
    if (lo_grads()) {
      be_.cast_from_bf16(p.shard.as<float>(), p.shard_lo.as<bf16>(), n);
      lo_pool_.push_back(std::move(p.full_lo));
      lo_pool_.push_back(std::move(p.shard_lo));
    }
    // acc += shard, as a backend op (the buffers may be device memory): a residual add without dropout.
    float* acc = grads_shard_.as<float>() + units_[p.unit].local_offset;
    be_.residual_forward(acc, acc, p.shard.as<float>(), units_[p.unit].shard, DropoutMask{});
    grad_pool_.push_back(std::move(p.full));
    shard_pool_.push_back(std::move(p.shard));
    pending_.erase(pending_.begin());
  }
}

void ShardedParams::begin_micro_batch(bool first, bool last) {
  last_micro_ = last;
  // The previous micro-batch's reductions finish before this backward asks for gradient buffers, so the
  // embedding's gradient buffer is reused rather than doubled under gradient accumulation.
  if (!first) {
    drain_pending(0);
    return;
  }
  if (grads_full_.data() != nullptr) be_.fill_zero(grads_full_.as<float>(), full_numel_);
  if (grads_shard_.data() != nullptr) be_.fill_zero(grads_shard_.as<float>(), local_numel_);
}

void ShardedParams::finish_grads() {
  flush_bucket();
  for (Work& w : grad_works_) w.join();
  grad_works_.clear();
  for (GradReduce& r : lo_reduces_) {
    r.work.join();
    be_.cast_from_bf16(r.dst, r.result, r.n);
    lo_pool_.push_back(std::move(r.lo));
  }
  lo_reduces_.clear();
  drain_pending(0);
}

double ShardedParams::grad_sq_norm() {
  const double local = be_.sum_squares_spans(local_grads_, region_spans_);  // one wait on a device
  if (!shards_optimizer() || size_ == 1) return local;
  float v = static_cast<float>(local);
  host_group_.all_reduce(&v, 1, DType::kF32).wait();
  return v;
}

Bf16Rounding ShardedParams::rounding(int64_t step) const {
  Bf16Rounding r;
  r.stochastic = options_.stochastic_rounding;
  r.rng = CounterRng(options_.rounding_seed, (static_cast<uint64_t>(step) << 8) ^ 0x73726f756e64ull);  // "sround"
  return r;
}

void ShardedParams::publish(int64_t step, bool lo_written) {
  if (lo_params()) {
    // The parameters as stored and communicated: bf16 copies of the master weights (or of their shards), where
    // master_lo() and the regions' lo_shift put them, rounded as the optimizer's pass rounds them (unless it
    // already did). Padding past a unit's end is never written: it stays 0 (the buffers start zero-filled).
    if (!lo_written) be_.round_to_bf16_spans(master_lo(), master(), region_spans_, rounding(step));
    if (!shards_optimizer()) {  // single/ddp: compute through fp32 from the bf16 values, unless bf16 only
      if (!lo_only_) be_.cast_from_bf16(params_full_.as<float>(), param_shard_lo_.as<bf16>(), full_numel_);
      return;
    }
  }
  if (strategy_ != Strategy::kZero1 && strategy_ != Strategy::kZero2) return;
  std::vector<Work> works;
  for (const UnitInfo& u : units_) {
    if (lo_params()) {  // in place: this rank's block is its shard
      bf16* full = params_full_lo_.as<bf16>() + u.full_offset;
      works.push_back(group_.all_gather(full + rank_ * u.shard, full, u.shard, DType::kBF16));
    } else {
      works.push_back(
          group_.all_gather(master() + u.local_offset, params_full_.as<float>() + u.full_offset, u.shard, DType::kF32));
    }
  }
  for (size_t i = 0; i < works.size(); ++i) {
    works[i].join();
    if (lo_params() && !lo_only_) {  // the fp32 copy, for fp32 compute
      const int64_t at = units_[i].full_offset;
      be_.cast_from_bf16(params_full_.as<float>() + at, params_full_lo_.as<bf16>() + at, units_[i].padded);
    }
  }
}

std::vector<float> ShardedParams::gather_full_weights() {
  std::vector<float> out;
  out.reserve(layout_.total_numel);
  for (const UnitInfo& u : units_) {
    if (!shards_optimizer()) {
      const size_t at = out.size();
      out.resize(at + u.numel);
      be_.to_host(out.data() + at, master() + u.local_offset, u.numel * sizeof(float));
      continue;
    }
    std::vector<float> shard(u.shard), full(u.padded);
    be_.to_host(shard.data(), master() + u.local_offset, u.shard * sizeof(float));
    host_group_.all_gather(shard.data(), full.data(), u.shard, DType::kF32).wait();
    out.insert(out.end(), full.begin(), full.begin() + u.numel);
  }
  return out;
}

}  // namespace gpt
