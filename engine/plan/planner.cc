#include "plan/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/backend.h"  // parse_gelu_fusion
#include "core/check.h"
#include "kernels/cuda/workspace.h"  // gelu_epilogue_fits
#include "plan/memory_model.h"
#include "plan/report.h"  // format_count

namespace gpt {

bool PlanInput::fused_gelu_backward() const {
  return gelu_fusion == "full" && bf16_compute() && cuda_workspace::gelu_epilogue_fits(int64_t{4} * shape.n_embd);
}

Status check_plan_input(const PlanInput& in) {
  const GptShape& s = in.shape;
  auto bad = [](const std::string& what, int64_t v) {
    return Status::invalid_argument(what + " must be positive, got " + std::to_string(v));
  };
  if (s.n_layer <= 0) return bad("model.n_layer", s.n_layer);
  if (s.n_head <= 0) return bad("model.n_head", s.n_head);
  if (s.n_embd <= 0) return bad("model.n_embd", s.n_embd);
  if (s.block_size <= 0) return bad("model.block_size", s.block_size);
  if (s.vocab_size <= 0) return bad("model.vocab_size", s.vocab_size);
  if (s.n_embd % s.n_head != 0) {
    return Status::invalid_argument("model.n_embd (" + std::to_string(s.n_embd) +
                                    ") must be a multiple of model.n_head (" + std::to_string(s.n_head) + ")");
  }
  if (in.micro_batch <= 0) return bad("micro-batch size", in.micro_batch);
  if (in.seq_len < 0 || in.seq_len > s.block_size) {
    return Status::invalid_argument("sequence length must be in [1, block_size " + std::to_string(s.block_size) +
                                    "] (0 = block_size), got " + std::to_string(in.seq_len));
  }
  if (in.micro_batches_per_step <= 0) return bad("micro-batches per step", in.micro_batches_per_step);
  if (in.world_size <= 0) return bad("world size", in.world_size);
  if (in.ranks_per_node <= 0) return bad("ranks per node", in.ranks_per_node);
  if (in.shard_group_size < 0 || (in.shard_group_size > 0 && in.world_size % in.shard_group_size != 0)) {
    return Status::invalid_argument("parallel.shard_group_size " + std::to_string(in.shard_group_size) +
                                    " does not divide the world size " + std::to_string(in.world_size));
  }
  if (in.sharding.prefetch < 0) {
    return Status::invalid_argument("parallel.prefetch must be >= 0, got " + std::to_string(in.sharding.prefetch));
  }
  if (const auto fusion = parse_gelu_fusion(in.gelu_fusion); !fusion) {
    return Status::invalid_argument("run.gelu_fusion: " + fusion.status().message());
  }
  return ActivationCheckpointing::parse(in.activation_checkpointing)
      .status()
      .with_context("training.activation_checkpointing");
}

std::string StrategyPlan::name() const { return (hybrid() ? "hybrid-" : "") + std::string(strategy_name(strategy)); }

namespace {

StrategyPlan make_plan(const PlanInput& in, const ModelLayout& layout, Strategy strategy, int group_size,
                       const ActivationBytes& act) {
  ShardedParamsSetup setup;
  setup.strategy = strategy;
  setup.group_size = group_size;
  setup.replicas = in.world_size / group_size;
  setup.options = in.sharding;
  setup.bf16_compute = in.bf16_compute();
  const ShardedParamsFigures f = simulate_sharded_params(layout, setup, in.micro_batches_per_step);
  const UnitSizes u = unit_sizes(layout, strategy, group_size);

  StrategyPlan p;
  p.strategy = strategy;
  p.shard_group_size = group_size;
  p.replicas = setup.replicas;
  p.padded_params = u.full;
  p.params = f.at(MemCategory::kParams);
  p.grads = f.at(MemCategory::kGrads);
  p.master = f.at(MemCategory::kMaster);
  p.optimizer = u.local * 8;  // AdamW: fp32 m and v over the local master buffer
  p.activations = act.stored + act.scratch + act.tokens;
  p.workspace = act.workspace;
  if (in.fused_attention) {  // run.device cuda: the backend's own workspaces too
    int64_t spans = 0;
    for (const UnitLayout& unit : layout.units) spans += static_cast<int64_t>(unit.params.size());
    p.workspace += cuda_backend_workspace_bytes(
        in.shape, in.micro_batch, in.seq_len > 0 ? in.seq_len : in.shape.block_size, in.bf16_compute(), u.local, spans);
  }
  p.comm_buffers = f.at(MemCategory::kComm);
  p.unit_buffers = f.pooled_bytes;
  auto op = [&](CommOp o) { return static_cast<size_t>(o); };
  p.comm_elements_per_step = {f.elements[op(CommOp::kAllReduce)], f.elements[op(CommOp::kReduceScatter)],
                              f.elements[op(CommOp::kAllGather)]};
  p.comm_bytes_per_step = {f.comm_bytes[op(CommOp::kAllReduce)], f.comm_bytes[op(CommOp::kReduceScatter)],
                           f.comm_bytes[op(CommOp::kAllGather)]};
  p.total = p.params + p.grads + p.master + p.optimizer + p.activations + p.workspace + p.comm_buffers;

  const int64_t a = in.micro_batches_per_step;
  const std::string in_flight = format_bytes(p.unit_buffers);
  switch (strategy) {
    case Strategy::kSingle:
      p.note = "one process; nothing to communicate";
      break;
    case Strategy::kDdp:
      p.note = "full replica per rank; gradients all-reduced per unit in the step's last micro-batch";
      break;
    case Strategy::kZero1:
      p.note =
          "master + AdamW sharded; full params and gradients; reduce-scatter in the last micro-batch, "
          "all-gather of the updated shards";
      break;
    case Strategy::kZero2:
      p.note = fmt::format(
          "also gradients: each unit reduce-scattered as its backward ends, every micro-batch (x{}); {} of "
          "pooled per-unit buffers",
          a, in_flight);
      break;
    case Strategy::kZero3:
      p.note = fmt::format(
          "also params: units gathered per micro-batch (x{}), prefetch {}, {}; {} of pooled per-unit buffers", a,
          in.sharding.prefetch,
          in.sharding.reshard_after_forward ? "backward re-gathers the blocks (embed and head stay)"
                                            : "kept from forward to backward",
          in_flight);
      break;
  }
  if (p.hybrid()) {
    p.note = fmt::format("{} inside shard groups of {} rank{}, gradient shards all-reduced over {} replicas; {}",
                         strategy_name(strategy), group_size, group_size == 1 ? "" : "s", p.replicas, p.note);
  }
  return p;
}

}  // namespace

std::vector<StrategyPlan> plan_all(const PlanInput& in) {
  const Status st = check_plan_input(in);
  GPT_CHECK_MSG(st.is_ok(), st.message().c_str());
  const ModelLayout layout = ModelLayout::build(in.shape);
  const ActivationCheckpointing ckpt = *ActivationCheckpointing::parse(in.activation_checkpointing);
  // Under bf16 compute the model stores its GEMM inputs in bf16; the trainer keeps a loss slot per micro-batch.
  const ActivationBytes act =
      activation_bytes(in.shape, in.micro_batch, in.seq_len > 0 ? in.seq_len : in.shape.block_size, ckpt,
                       in.fused_attention, in.bf16_compute() ? DType::kBF16 : DType::kF32, std::nullopt,
                       in.fused_gelu_backward(), static_cast<int>(in.micro_batches_per_step));
  const int N = in.world_size;
  std::vector<StrategyPlan> plans;
  if (N == 1) plans.push_back(make_plan(in, layout, Strategy::kSingle, 1, act));
  for (Strategy s : {Strategy::kDdp, Strategy::kZero1, Strategy::kZero2, Strategy::kZero3}) {
    plans.push_back(make_plan(in, layout, s, N, act));
  }
  const int S = in.shard_group_size > 0 ? in.shard_group_size : in.ranks_per_node;
  // Hybrid needs 1 < S < N, or S = 1 asked for (parallel.shard_group_size 1, or 0 with one rank per node, which
  // plan_input resolves to 1: every rank its own shard group, the shards replicated over all ranks), so that every
  // run the trainer accepts has its plan.
  if ((S > 1 || in.shard_group_size == 1) && S < N && N % S == 0) {
    for (Strategy s : {Strategy::kZero2, Strategy::kZero3}) plans.push_back(make_plan(in, layout, s, S, act));
  }
  return plans;
}

int64_t ring_equivalent_elements(const CommVolume& v) { return 2 * v.all_reduce + v.reduce_scatter + v.all_gather; }

int64_t device_memory_reserve_bytes(const ParallelSection& parallel) {
  return std::llround(static_cast<double>(parallel.device_memory_reserve_gb) * 1e9);
}

Expected<const StrategyPlan*> find_run_plan(const std::vector<StrategyPlan>& plans, Strategy strategy,
                                            int shard_group_size, int world_size) {
  const bool hybrid = shard_group_size != world_size;
  for (const StrategyPlan& p : plans) {
    if (p.strategy == strategy && p.hybrid() == hybrid) return &p;
  }
  return Status::failed_precondition(
      fmt::format("the planner has no plan for {}{} in shard groups of {} of the {} ranks (a bug in gpt-train)",
                  hybrid ? "hybrid " : "", strategy_name(strategy), shard_group_size, world_size));
}

std::string DeviceBudget::describe() const {
  return fmt::format("the {} free on {} less parallel.device_memory_reserve_gb ({}): {}", format_bytes(free),
                     gpu.empty() ? fmt::format("rank {}'s GPU", rank) : gpu, format_bytes(reserve),
                     format_bytes(bytes()));
}

namespace {

// The plans auto chooses from, least communication first (ties to less sharding).
std::vector<const StrategyPlan*> auto_candidates(const std::vector<StrategyPlan>& plans) {
  std::vector<const StrategyPlan*> order;
  for (const StrategyPlan& p : plans) {
    if (!p.hybrid()) order.push_back(&p);
  }
  std::stable_sort(order.begin(), order.end(), [](const StrategyPlan* x, const StrategyPlan* y) {
    const int64_t cx = ring_equivalent_elements(x->comm_elements_per_step);
    const int64_t cy = ring_equivalent_elements(y->comm_elements_per_step);
    return cx != cy ? cx < cy : static_cast<int>(x->strategy) < static_cast<int>(y->strategy);
  });
  return order;
}

constexpr char kShrinkHint[] =
    "try training.activation_checkpointing: full, a smaller training.micro_batch_size, or more ranks";

}  // namespace

Expected<AutoChoice> choose_auto(const std::vector<StrategyPlan>& plans, double device_memory_gb,
                                 const std::optional<DeviceBudget>& device) {
  if (plans.empty()) return Status::invalid_argument("no strategies to choose from");
  const std::vector<const StrategyPlan*> order = auto_candidates(plans);
  if (order.empty()) return Status::invalid_argument("no non-hybrid strategies to choose from");
  const bool limited = device_memory_gb > 0 || device.has_value();
  double limit = std::numeric_limits<double>::infinity();
  std::string where;
  if (device_memory_gb > 0) {
    limit = device_memory_gb * 1e9;
    where = fmt::format("{:g} GB per rank", device_memory_gb);
  }
  if (device && static_cast<double>(device->bytes()) < limit) {  // the GPU bounds a device_memory_gb above it too
    limit = static_cast<double>(device->bytes());
    where = device->describe();
  }
  std::string skipped;
  for (const StrategyPlan* p : order) {
    const std::string name(strategy_name(p->strategy));
    if (static_cast<double>(p->total) > limit) {
      skipped += fmt::format("{}{} needs {}", skipped.empty() ? "" : ", ", name, format_bytes(p->total));
      continue;
    }
    const int64_t comm = ring_equivalent_elements(p->comm_elements_per_step);
    AutoChoice choice{p->strategy, ""};
    if (!limited) {
      choice.reason = fmt::format(
          "no device memory given, so the least communication wins: {} ({} elements per "
          "step; {} per rank)",
          name, format_count(comm), format_bytes(p->total));
    } else if (skipped.empty()) {
      choice.reason = fmt::format("{} needs {}, fits in {} and communicates the least ({} elements per step)", name,
                                  format_bytes(p->total), where, format_count(comm));
    } else {
      choice.reason = fmt::format(
          "{} needs {} and is the least-communication plan that fits in {} ({}; {} "
          "elements per step)",
          name, format_bytes(p->total), where, skipped, format_count(comm));
    }
    return choice;
  }
  const StrategyPlan* smallest =
      *std::min_element(order.begin(), order.end(), [](auto* x, auto* y) { return x->total < y->total; });
  const bool reserve_would_do = device && device->reserve_in_the_way(smallest->total);
  return Status::invalid_argument(
      fmt::format("no strategy fits in {}: the smallest, {}, needs {} ({} of it activations and workspace); {}{}",
                  where, strategy_name(smallest->strategy), format_bytes(smallest->total),
                  format_bytes(smallest->activations + smallest->workspace), kShrinkHint,
                  reserve_would_do ? ", or lower parallel.device_memory_reserve_gb" : ""));
}

Status check_plan_fits(const StrategyPlan& plan, const std::vector<StrategyPlan>& plans, const DeviceBudget& device) {
  if (plan.total <= device.bytes()) return Status::ok();
  std::string fit;
  int n = 0;
  for (const StrategyPlan& p : plans) {
    if (p.total > device.bytes() || p.name() == plan.name()) continue;
    // As the config says it: hybrid is parallel.strategy hybrid with its inner sharding.
    const std::string name =
        p.hybrid() ? fmt::format("hybrid with parallel.hybrid_inner {}", strategy_name(p.strategy)) : p.name();
    fit += fmt::format("{}{} ({})", n++ == 0 ? "" : ", ", name, format_bytes(p.total));
  }
  std::string advice = n == 0   ? fmt::format("No other strategy fits either: {}", kShrinkHint)
                       : n == 1 ? fmt::format("{} would fit (parallel.strategy), or {}", fit, kShrinkHint)
                                : fmt::format("These would fit: {} (parallel.strategy); or {}", fit, kShrinkHint);
  if (device.reserve_in_the_way(plan.total)) advice += ", or lower parallel.device_memory_reserve_gb";
  return Status::invalid_argument(fmt::format(
      "{} needs {} per rank ({} of it activations and workspace), more than {}; none of its buffers was allocated. {} "
      "(`gpt-train plan` prints every strategy's figures)",
      plan.name(), format_bytes(plan.total), format_bytes(plan.activations + plan.workspace), device.describe(),
      advice));
}

std::string format_bytes(int64_t bytes) {
  // A difference can be negative (the driver's count since the start, say): its sign, then its size in units.
  if (bytes < 0) {
    const int64_t size = bytes == std::numeric_limits<int64_t>::min() ? std::numeric_limits<int64_t>::max() : -bytes;
    return fmt::format("-{}", format_bytes(size));
  }
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < (int64_t{1} << 20)) return fmt::format("{:.1f} KiB", b / 1024.0);
  if (bytes < (int64_t{1} << 30)) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
  return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0));
}

// ---- The ZeRO paper (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", 2020), section 5.1 and Figure 1.

double ZeroPaperBytes::at(ZeroStage s) const {
  switch (s) {
    case ZeroStage::kBaseline:
      return baseline;
    case ZeroStage::kPos:
      return pos;
    case ZeroStage::kPosG:
      return pos_g;
    case ZeroStage::kPosGP:
      return pos_g_p;
  }
  return baseline;
}

ZeroPaperBytes zero_paper_model_state(double psi, int n, double k) {
  const double nd = n;
  return {(4 + k) * psi, 4 * psi + k * psi / nd, 2 * psi + (2 + k) * psi / nd, (4 + k) * psi / nd};
}

double zero_paper_max_params(double device_bytes, int n, double k, ZeroStage stage) {
  // Bytes per parameter at each stage, from zero_paper_model_state with Ψ = 1.
  return device_bytes / zero_paper_model_state(1.0, n, k).at(stage);
}

ShardingOptions sharding_options(const ParallelSection& parallel) {
  auto dtype = [](const std::string& name) { return name == "bf16" ? DType::kBF16 : DType::kF32; };
  return ShardingOptions{parallel.prefetch,
                         parallel.reshard_after_forward,
                         dtype(parallel.param_dtype),
                         dtype(parallel.reduce_dtype),
                         static_cast<int64_t>(static_cast<double>(parallel.bucket_mb) * 1024.0 * 1024.0),
                         parallel.stochastic_rounding,
                         /*rounding_seed=*/0};  // the trainer sets run.seed
}

Status check_batch_split(const RunConfig& cfg, int world_size) {
  const int64_t global = cfg.global_batch(), micro = cfg.training.micro_batch_size;
  if (global % world_size == 0 && (global / world_size) % micro == 0) return Status::ok();
  // What would work: with the world size kept, the largest micro-batch up to this one that divides each rank's share
  // (no larger one needs less memory), or a global batch that is the next multiple of world size x micro-batch.
  std::string fix;
  if (global % world_size == 0) {
    const int64_t per_rank = global / world_size;
    int64_t best = std::min(micro, per_rank);
    while (per_rank % best != 0) --best;
    fix = "; at this world size, training.micro_batch_size " + std::to_string(best) + " divides each rank's " +
          std::to_string(per_rank) + " sequences";
  } else {
    const int64_t step = static_cast<int64_t>(world_size) * micro;
    fix = "; a global batch of " + std::to_string((global + step - 1) / step * step) + " sequences would (" +
          std::to_string(world_size) + " x " + std::to_string(micro) + " x gradient accumulation steps)";
  }
  return Status::invalid_argument(cfg.where("training.micro_batch_size") + ": the global batch of " +
                                  std::to_string(global) + " sequences must split evenly over " +
                                  std::to_string(world_size) + " ranks into micro-batches of " + std::to_string(micro) +
                                  " (training.global_batch_sequences or training.global_batch_tokens, "
                                  "training.micro_batch_size)" +
                                  fix);
}

Expected<int> run_shard_group_size(const RunConfig& cfg, int world_size, int ranks_per_node) {
  if (cfg.parallel.strategy != "hybrid") return world_size;
  const int configured = cfg.parallel.shard_group_size;
  const int S = configured > 0 ? configured : ranks_per_node;
  if (S <= 0 || world_size % S != 0) {
    return Status::invalid_argument(cfg.where("parallel.shard_group_size") + ": " +
                                    (configured > 0 ? "parallel.shard_group_size " + std::to_string(S)
                                                    : "a shard group of " + std::to_string(S) +
                                                          " ranks (parallel.shard_group_size 0: the ranks per node)") +
                                    " does not divide the " + std::to_string(world_size) + " ranks of this job");
  }
  return S;
}

Expected<PlanInput> plan_input(const RunConfig& cfg, const GptShape& shape, int world_size, int ranks_per_node) {
  GPT_RETURN_IF_ERROR(check_batch_split(cfg, world_size));
  PlanInput in;
  in.shape = shape;
  in.micro_batch = cfg.training.micro_batch_size;
  in.micro_batches_per_step = cfg.global_batch() / world_size / cfg.training.micro_batch_size;
  in.world_size = world_size;
  in.ranks_per_node = ranks_per_node;
  if (cfg.parallel.strategy == "hybrid") {
    GPT_ASSIGN_OR_RETURN(in.shard_group_size, run_shard_group_size(cfg, world_size, ranks_per_node));
  }
  in.activation_checkpointing = cfg.training.activation_checkpointing;
  in.fused_attention = cfg.run.device == "cuda";
  in.gelu_fusion = cfg.gelu_fusion();
  in.sharding = sharding_options(cfg.parallel);
  return in;
}

}  // namespace gpt
