#include "plan/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace gpt {

std::string format_count(int64_t n) {
  const double d = static_cast<double>(n);
  if (n < 1000) return std::to_string(n);
  if (n < 1000000) return fmt::format("{:.1f}K", d / 1e3);
  if (n < 1000000000) return fmt::format("{:.2f}M", d / 1e6);
  return fmt::format("{:.2f}B", d / 1e9);
}

namespace {
std::string_view dtype_label(DType t) { return t == DType::kBF16 ? "bf16" : "fp32"; }
std::string device_label(const PlanInput& in) {
  if (!in.fused_attention) return "cpu";
  std::string label = "cuda (fused attention; cuBLASLt, scratch and cast areas under workspace)";
  if (in.gelu_fusion != "none") {
    label += ", gelu_fusion " + in.gelu_fusion +
             (in.fused_gelu_backward() ? " (the GELU backward in the projection GEMM's epilogue)" : "");
  }
  return label;
}
}  // namespace

std::string plan_report(const PlanInput& in, const std::vector<StrategyPlan>& plans) {
  const GptShape& s = in.shape;
  const int T = in.seq_len > 0 ? in.seq_len : s.block_size;
  const int per_node = std::min(in.ranks_per_node, in.world_size);
  std::string out = fmt::format(
      "model: {} layers, {} heads, {} wide, block {}, vocab {}: {} parameters\n"
      "batch: micro-batches of {} x {} tokens, {} per rank per step; world size {} ({} rank(s) per node); "
      "activation checkpointing: {}\n"
      "parallel: param_dtype {}, reduce_dtype {}, prefetch {}, reshard_after_forward {} (master weights, "
      "AdamW state, gradient accumulation and activations in fp32{})\n"
      "device: {}\n\n",
      s.n_layer, s.n_head, s.n_embd, s.block_size, s.vocab_size, format_count(s.num_params()), in.micro_batch, T,
      in.micro_batches_per_step, in.world_size, per_node, in.activation_checkpointing,
      dtype_label(in.sharding.param_dtype), dtype_label(in.sharding.reduce_dtype), in.sharding.prefetch,
      in.sharding.reshard_after_forward,
      in.bf16_compute() ? ", but for the GEMMs' inputs, outputs (the logits too) and input gradients in bf16" : "",
      device_label(in));

  constexpr int kLabel = 28, kCol = 14;
  auto row = [&](const std::string& label, const std::function<std::string(const StrategyPlan&)>& cell) {
    out += fmt::format("{:<{}}", label, kLabel);
    for (const StrategyPlan& p : plans) out += fmt::format("{:>{}}", cell(p), kCol);
    out += "\n";
  };
  auto bytes = [](int64_t StrategyPlan::*field) {
    return [field](const StrategyPlan& p) { return p.*field == 0 ? std::string("-") : format_bytes(p.*field); };
  };
  auto count = [](int64_t CommVolume::*field) {
    return [field](const StrategyPlan& p) {
      const int64_t n = p.comm_elements_per_step.*field;
      return n == 0 ? std::string("-") : format_count(n);
    };
  };
  auto comm_bytes = [](int64_t CommVolume::*field) {
    return [field](const StrategyPlan& p) {
      const int64_t n = p.comm_bytes_per_step.*field;
      return n == 0 ? std::string("-") : format_bytes(n);
    };
  };

  row("memory per rank", [](const StrategyPlan& p) { return p.name(); });
  row("  params", bytes(&StrategyPlan::params));
  row("  grads", bytes(&StrategyPlan::grads));
  row("  master", bytes(&StrategyPlan::master));
  row("  optimizer", bytes(&StrategyPlan::optimizer));
  row("  activations", bytes(&StrategyPlan::activations));
  row("  workspace", bytes(&StrategyPlan::workspace));
  row("  comm buffers", bytes(&StrategyPlan::comm_buffers));
  row("  total", bytes(&StrategyPlan::total));
  row(fmt::format("  total per node (x{})", per_node),
      [&](const StrategyPlan& p) { return format_bytes(p.total * per_node); });
  row("comm per rank per step", [](const StrategyPlan&) { return std::string(); });
  row("  Phi (padded parameters)", [](const StrategyPlan& p) { return format_count(p.padded_params); });
  row("  all-reduce (elements)", count(&CommVolume::all_reduce));
  row("  reduce-scatter (elements)", count(&CommVolume::reduce_scatter));
  row("  all-gather (elements)", count(&CommVolume::all_gather));
  row("  all-reduce (bytes)", comm_bytes(&CommVolume::all_reduce));
  row("  reduce-scatter (bytes)", comm_bytes(&CommVolume::reduce_scatter));
  row("  all-gather (bytes)", comm_bytes(&CommVolume::all_gather));
  row("  total (bytes)", [](const StrategyPlan& p) {
    const int64_t n = p.comm_bytes_per_step.total();
    return n == 0 ? std::string("-") : format_bytes(n);
  });
  out += "\n";
  for (const StrategyPlan& p : plans) out += fmt::format("{:<14}{}\n", p.name(), p.note);
  if (in.fused_attention) {
    out +=
        "\nThe totals are gpt-train's own device buffers. The CUDA context, cuBLAS(Lt) and NCCL allocate more for\n"
        "themselves; a run logs that amount after step 1 (\"device memory after step 1\"; summary.json\n"
        "device_memory_bytes.untracked). On cuda, train holds the plan to the GPU's free memory at the start less\n"
        "parallel.device_memory_reserve_gb (NCCL's buffers come later) and stops before allocating the plan's\n"
        "buffers if it does not fit; auto picks within that (and parallel.device_memory_gb if smaller).\n";
  }
  return out;
}

}  // namespace gpt
