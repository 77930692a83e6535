// Whole-model checks: finite-difference gradients, activation checkpointing (bitwise equal gradients,
// lower activation memory), dropout reproducibility.
#include "model/gpt.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/widened_params.h"
#include "parallel/sharded_params.h"
#include "plan/memory_model.h"

namespace gpt {
namespace {

GptShape tiny_shape(float dropout = 0.0f) {
  GptShape s;
  s.n_layer = 2;
  s.n_head = 2;
  s.n_embd = 8;
  s.block_size = 6;
  s.vocab_size = 7;
  s.dropout = dropout;
  return s;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch make_batch(int B, int T, int V, uint64_t seed) {
  Batch b;
  CounterRng rng(seed, 99);
  for (int i = 0; i < B * T; ++i) {
    b.inputs.push_back(static_cast<int32_t>(rng.u32(2 * i) % V));
    b.targets.push_back(static_cast<int32_t>(rng.u32(2 * i + 1) % V));
  }
  return b;
}

// Runs one forward/backward and returns (loss, gradients).
std::pair<float, std::vector<float>> loss_and_grads(Gpt& model, ShardedParams& params, const Batch& batch, int B, int T,
                                                    const StepContext& ctx) {
  params.begin_micro_batch(true, true);
  const float loss =
      model.forward_backward(params, batch.inputs.data(), batch.targets.data(), 1.0f / static_cast<float>(B * T), ctx);
  return {loss, std::vector<float>(params.local_grads(), params.local_grads() + params.local_numel())};
}

// A model prepared for (B, T) with single-rank parameters (seed 9), and the activation bytes prepare took.
struct Prepared {
  std::unique_ptr<Gpt> model;
  std::unique_ptr<Communicator> single = make_single_communicator();
  std::unique_ptr<ShardedParams> params;
  int64_t act_bytes = 0;
};
Prepared prepare_model(Backend& backend, const GptShape& shape, const char* ckpt, int64_t head_rows, int B, int T,
                       std::optional<DType> gemm_inputs = std::nullopt) {
  auto& tracker = MemTracker::instance();
  const int64_t before = tracker.stats().current[static_cast<size_t>(MemCategory::kActivations)];
  Prepared p;
  p.model = std::make_unique<Gpt>(shape, backend, *ActivationCheckpointing::parse(ckpt));
  p.model->set_head_rows(head_rows);
  if (gemm_inputs) p.model->set_gemm_input_dtype(*gemm_inputs);
  p.params = std::make_unique<ShardedParams>(p.model->layout(), backend, *p.single, Strategy::kSingle);
  p.params->init(shape, 9);
  p.model->prepare(B, T);
  p.act_bytes = tracker.stats().current[static_cast<size_t>(MemCategory::kActivations)] - before;
  return p;
}

TEST_CASE("GPT gradients match central finite differences", "[model]") {
  for (float dropout : {0.0f, 0.2f}) {
    CAPTURE(dropout);
    auto backend = std::move(*make_backend("cpu"));
    const GptShape shape = tiny_shape(dropout);
    Gpt model(shape, *backend);
    auto single = make_single_communicator();
    ShardedParams params(model.layout(), *backend, *single, Strategy::kSingle);
    params.init(shape, 3);
    // Make LayerNorm and bias parameters non-trivial so their gradients are exercised.
    CounterRng jitter(5, 5);
    for (int64_t i = 0; i < params.local_numel(); ++i) params.master()[i] += 0.05f * jitter.normal(i);
    const int B = 2, T = 6;
    model.prepare(B, T);
    const Batch batch = make_batch(B, T, shape.vocab_size, 1);
    StepContext ctx{7, 3, 0, true};
    auto [loss, grads] = loss_and_grads(model, params, batch, B, T, ctx);
    REQUIRE(std::isfinite(loss));

    // Check every parameter tensor at a few positions (including its largest gradient).
    int checked = 0, bad = 0;
    for (size_t u = 0; u < model.layout().units.size(); ++u) {
      const auto& unit = model.layout().units[u];
      for (const auto& p : unit.params) {
        const int64_t base = params.regions()[u].local_offset + p.offset;
        int64_t argmax = 0;
        for (int64_t i = 0; i < p.numel; ++i)
          if (std::abs(grads[base + i]) > std::abs(grads[base + argmax])) argmax = i;
        for (int64_t i : {int64_t{0}, p.numel / 2, p.numel - 1, argmax}) {
          float* w = params.master() + base + i;
          const float orig = *w;
          const float eps = 1e-2f;
          *w = orig + eps;
          const double lp = model.forward_loss(params, batch.inputs.data(), batch.targets.data(), ctx);
          *w = orig - eps;
          const double lm = model.forward_loss(params, batch.inputs.data(), batch.targets.data(), ctx);
          *w = orig;
          const double numeric = (lp - lm) / (2.0 * eps);
          const double analytic = grads[base + i];
          const double tol = 2e-3 + 2e-2 * std::max(std::abs(numeric), std::abs(analytic));
          ++checked;
          if (std::abs(numeric - analytic) > tol) {
            ++bad;
            WARN(unit.name << "." << p.name << "[" << i << "]: analytic " << analytic << " numeric " << numeric);
          }
        }
      }
    }
    REQUIRE(checked == 4 * (2 + 12 * 2 + 2));
    REQUIRE(bad == 0);
  }
}

TEST_CASE("Activation checkpointing gives bitwise-equal gradients with less activation memory", "[model]") {
  auto backend = std::move(*make_backend("cpu"));
  GptShape shape = tiny_shape(0.1f);
  shape.n_layer = 4;
  shape.n_embd = 16;
  shape.block_size = 16;
  const int B = 3, T = 16;
  const Batch batch = make_batch(B, T, shape.vocab_size, 2);
  const StepContext ctx{11, 5, 6, true};

  std::vector<float> ref_grads;
  float ref_loss = 0;
  int64_t ref_act_bytes = 0;
  for (const char* mode : {"none", "full", "every:2", "selective"}) {
    CAPTURE(mode);
    Prepared m = prepare_model(*backend, shape, mode, Gpt::kHeadRows, B, T);
    const int64_t act_bytes = m.act_bytes;
    auto [loss, grads] = loss_and_grads(*m.model, *m.params, batch, B, T, ctx);
    if (std::string(mode) == "none") {
      ref_grads = grads;
      ref_loss = loss;
      ref_act_bytes = act_bytes;
      continue;
    }
    REQUIRE(loss == ref_loss);
    REQUIRE(std::memcmp(grads.data(), ref_grads.data(), grads.size() * sizeof(float)) == 0);
    REQUIRE(act_bytes < ref_act_bytes);
    INFO("activation bytes " << act_bytes << " vs none " << ref_act_bytes);
  }
}

// The LM head in row chunks (Gpt::head_rows) holds one chunk's logits instead of all (B*T, V), and computes
// the same: per-row losses and logits are per-row products, and wte's gradient only adds the chunks' parts.
TEST_CASE("The LM head in row chunks: the same loss, logits and gradients with less activation memory", "[model]") {
  auto backend = std::move(*make_backend("cpu"));
  GptShape shape = tiny_shape(0.1f);
  shape.n_embd = 16;
  shape.block_size = 16;
  shape.vocab_size = 37;
  const int B = 3, T = 16;  // 48 rows: chunks of 48 (one), 16, 7 (the last one short)
  const Batch batch = make_batch(B, T, shape.vocab_size, 4);
  const StepContext ctx{11, 5, 6, true}, eval{11, 0, 0, false};
  float ref_loss = 0, ref_eval = 0;
  std::vector<float> ref_grads, ref_logits;
  int64_t ref_act_bytes = 0;
  for (const int64_t rows : {int64_t{48}, int64_t{16}, int64_t{7}}) {
    CAPTURE(rows);
    Prepared m = prepare_model(*backend, shape, "none", rows, B, T);
    const int64_t act_bytes = m.act_bytes;
    auto [loss, grads] = loss_and_grads(*m.model, *m.params, batch, B, T, ctx);
    const float eval_loss = m.model->forward_loss(*m.params, batch.inputs.data(), batch.targets.data(), eval);
    const float* l = m.model->forward_logits(*m.params, batch.inputs.data(), eval);
    std::vector<float> logits(l, l + static_cast<size_t>(B) * T * shape.vocab_size);
    // The logits are (B*T, V) however the head pads its rows (Gpt::logits_stride(37) = 48): their cross-entropy on
    // the host is the evaluation loss.
    double ce = 0.0;
    for (int64_t i = 0; i < int64_t{B} * T; ++i) {
      const float* z = logits.data() + i * shape.vocab_size;
      const float zmax = *std::max_element(z, z + shape.vocab_size);
      double sum = 0.0;
      for (int j = 0; j < shape.vocab_size; ++j) sum += std::exp(static_cast<double>(z[j]) - zmax);
      ce += std::log(sum) + zmax - z[batch.targets[static_cast<size_t>(i)]];
    }
    CHECK(ce / (B * T) == Approx(eval_loss).epsilon(1e-5));
    if (rows == 48) {
      ref_loss = loss, ref_eval = eval_loss, ref_grads = grads, ref_logits = logits, ref_act_bytes = act_bytes;
      continue;
    }
    CHECK(loss == Approx(ref_loss).epsilon(1e-6));
    CHECK(eval_loss == Approx(ref_eval).epsilon(1e-6));
    float scale = 0.0f, worst = 0.0f;
    for (size_t i = 0; i < grads.size(); ++i) {
      scale = std::max(scale, std::abs(ref_grads[i]));
      worst = std::max(worst, std::abs(grads[i] - ref_grads[i]));
    }
    CHECK(worst <= 1e-6f * scale);
    float lworst = 0.0f;
    for (size_t i = 0; i < logits.size(); ++i) lworst = std::max(lworst, std::abs(logits[i] - ref_logits[i]));
    CHECK(lworst <= 1e-5f);
    CHECK(act_bytes < ref_act_bytes);
  }
}

// A step's micro-batches queued without waiting (the trainer's way): their losses, read once from the loss slots,
// and the accumulated gradients are bit for bit those of forward_backward one micro-batch at a time; the extra slots
// are the planner's.
TEST_CASE("forward_backward_into: a step's micro-batches in loss slots, read once, as forward_backward", "[model]") {
  auto backend = std::move(*make_backend("cpu"));
  GptShape shape = tiny_shape(0.1f);
  shape.block_size = 16;
  const int B = 2, T = 16, micro = 3;
  const std::vector<Batch> batches = {make_batch(B, T, shape.vocab_size, 21), make_batch(B, T, shape.vocab_size, 22),
                                      make_batch(B, T, shape.vocab_size, 23)};
  auto run = [&](bool queued, std::vector<float>& losses, int64_t& act_bytes) {
    Prepared m = prepare_model(*backend, shape, "none", Gpt::kHeadRows, B, T);
    const int64_t one_slot = m.act_bytes;
    auto& tracker = MemTracker::instance();
    const int64_t before = tracker.stats().current[static_cast<size_t>(MemCategory::kActivations)];
    if (queued) m.model->prepare(B, T, micro);
    act_bytes = tracker.stats().current[static_cast<size_t>(MemCategory::kActivations)] - before + one_slot;
    for (int k = 0; k < micro; ++k) {
      m.params->begin_micro_batch(k == 0, k + 1 == micro);
      const Batch& b = batches[static_cast<size_t>(k)];
      const StepContext ctx{11, 5, static_cast<int64_t>(k) * B, true};
      if (queued) {
        m.model->forward_backward_into(*m.params, b.inputs.data(), b.targets.data(), 0.01f, ctx, k);
      } else {
        losses.push_back(m.model->forward_backward(*m.params, b.inputs.data(), b.targets.data(), 0.01f, ctx));
      }
    }
    if (queued) losses = m.model->mean_losses(micro);
    return std::vector<float>(m.params->local_grads(), m.params->local_grads() + m.params->local_numel());
  };
  std::vector<float> one_by_one, queued;
  int64_t bytes_one = 0, bytes_queued = 0;
  const std::vector<float> grads_one = run(false, one_by_one, bytes_one);
  const std::vector<float> grads_queued = run(true, queued, bytes_queued);
  REQUIRE(queued.size() == static_cast<size_t>(micro));
  CHECK(std::memcmp(queued.data(), one_by_one.data(), queued.size() * sizeof(float)) == 0);
  CHECK(queued[0] != queued[1]);  // different batches, different losses: the slots are not one
  CHECK(std::memcmp(grads_queued.data(), grads_one.data(), grads_one.size() * sizeof(float)) == 0);
  const ActivationBytes planned = activation_bytes(shape, B, T, *ActivationCheckpointing::parse("none"), false,
                                                   DType::kF32, std::nullopt, false, micro);
  CHECK(bytes_queued == planned.stored + planned.scratch + planned.tokens);
}

// Under bf16 compute the GEMMs multiply bf16 inputs, so the activations only GEMMs read (ln_1, ln_2, ln_f and
// the GELU output) are stored in bf16: the same bits the GEMMs would round fp32 copies to, in half the memory.
TEST_CASE("bf16 compute: GEMM inputs stored in bf16 compute bit for bit what fp32 copies rounded per GEMM do",
          "[model]") {
  auto backend = std::move(*make_backend("cpu"));
  backend->set_compute_dtype(DType::kBF16);
  GptShape shape = tiny_shape(0.1f);
  shape.n_embd = 12;  // rows of 12 bf16: 24 bytes, so chunk and row offsets are not 16-byte multiples
  shape.block_size = 16;
  shape.vocab_size = 37;
  const int B = 3, T = 16;
  const Batch batch = make_batch(B, T, shape.vocab_size, 6);
  const StepContext ctx{11, 5, 6, true}, eval{11, 0, 0, false};
  for (const char* mode : {"none", "full", "selective"}) {
    for (const int64_t rows : {int64_t{48}, int64_t{7}}) {
      CAPTURE(mode, rows);
      struct Run {
        float loss = 0, eval = 0;
        std::vector<float> grads, logits;
        int64_t act_bytes = 0;
      };
      auto run = [&](DType gemm_inputs) {
        Prepared m = prepare_model(*backend, shape, mode, rows, B, T, gemm_inputs);
        REQUIRE(m.model->gemm_input_dtype() == gemm_inputs);
        Run r;
        r.act_bytes = m.act_bytes;
        std::tie(r.loss, r.grads) = loss_and_grads(*m.model, *m.params, batch, B, T, ctx);
        r.eval = m.model->forward_loss(*m.params, batch.inputs.data(), batch.targets.data(), eval);
        const float* l = m.model->forward_logits(*m.params, batch.inputs.data(), eval);
        r.logits.assign(l, l + static_cast<size_t>(B) * T * shape.vocab_size);
        return r;
      };
      const Run f32 = run(DType::kF32), lo = run(DType::kBF16);
      REQUIRE(lo.loss == f32.loss);
      REQUIRE(lo.eval == f32.eval);
      REQUIRE(std::memcmp(lo.grads.data(), f32.grads.data(), lo.grads.size() * sizeof(float)) == 0);
      REQUIRE(std::memcmp(lo.logits.data(), f32.logits.data(), lo.logits.size() * sizeof(float)) == 0);
      // The planner's count (which chunks the head by the default Gpt::head_rows) is what prepare took, in both
      // layouts.
      const ActivationCheckpointing ckpt = *ActivationCheckpointing::parse(mode);
      for (const auto& [r, type] : {std::pair{&f32, DType::kF32}, std::pair{&lo, DType::kBF16}}) {
        const ActivationBytes planned = activation_bytes(shape, B, T, ckpt, false, type, DType::kBF16);
        if (rows == B * T) CHECK(r->act_bytes == planned.stored + planned.scratch + planned.tokens);
      }
      CHECK(lo.act_bytes < f32.act_bytes);
    }
  }
  // And the rounding is real: fp32 compute differs, by a bf16-sized amount.
  backend->set_compute_dtype(DType::kF32);
  Prepared m = prepare_model(*backend, shape, "none", Gpt::kHeadRows, B, T);
  REQUIRE(m.model->gemm_input_dtype() == DType::kF32);
  const float exact = loss_and_grads(*m.model, *m.params, batch, B, T, ctx).first;
  backend->set_compute_dtype(DType::kBF16);
  Prepared h = prepare_model(*backend, shape, "none", Gpt::kHeadRows, B, T);
  REQUIRE(h.model->gemm_input_dtype() == DType::kBF16);
  const float rounded = loss_and_grads(*h.model, *h.params, batch, B, T, ctx).first;
  CHECK(rounded != exact);
  CHECK(rounded == Approx(exact).epsilon(1e-2));
}

// Under param_dtype bf16 and bf16 compute the ParamSource holds the parameters in bf16 only: GEMMs take the weights
// uncast and LayerNorm, the biases and the embedding read them widened, which must compute what the widened fp32
// parameters give (GEMMs rounding them back), bit for bit.
TEST_CASE("bf16 compute: bf16-only parameters give the results of their widened fp32 values", "[model]") {
  auto backend = std::move(*make_backend("cpu"));
  backend->set_compute_dtype(DType::kBF16);
  GptShape shape = tiny_shape(0.1f);
  shape.n_embd = 12;
  shape.block_size = 16;
  shape.vocab_size = 37;
  const int B = 3, T = 16;
  const Batch batch = make_batch(B, T, shape.vocab_size, 8);
  const StepContext ctx{11, 5, 6, true}, eval{11, 0, 0, false};
  auto single = make_single_communicator();
  for (const Strategy strategy :
       {Strategy::kSingle, Strategy::kDdp, Strategy::kZero1, Strategy::kZero2, Strategy::kZero3}) {
    for (const DType param : {DType::kF32, DType::kBF16}) {
      CAPTURE(strategy_name(strategy), dtype_name(param));
      Gpt model(shape, *backend, *ActivationCheckpointing::parse("selective"));
      model.set_head_rows(7);
      model.prepare(B, T);
      ShardingOptions options;
      options.param_dtype = param;
      ShardedParams params(model.layout(), *backend, *single, strategy, nullptr, options);
      params.init(shape, 9);
      for (int unit = 0; unit < static_cast<int>(model.layout().units.size()); ++unit) {
        CHECK(params.acquire(unit).is_bf16() == (param == DType::kBF16));
        params.release(unit);
      }
      testing::WidenedParams cast(params, *backend, model.layout());
      float loss[2], eval_loss[2];
      std::vector<float> grads[2];
      for (int i = 0; i < 2; ++i) {
        ParamSource& source = i == 0 ? static_cast<ParamSource&>(cast) : params;
        params.begin_micro_batch(true, true);
        loss[i] = model.forward_backward(source, batch.inputs.data(), batch.targets.data(), 1.0f / (B * T), ctx);
        params.finish_grads();
        grads[i].assign(params.local_grads(), params.local_grads() + params.local_numel());
        eval_loss[i] = model.forward_loss(source, batch.inputs.data(), batch.targets.data(), eval);
      }
      REQUIRE(loss[1] == loss[0]);
      REQUIRE(eval_loss[1] == eval_loss[0]);
      REQUIRE(std::memcmp(grads[1].data(), grads[0].data(), grads[0].size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("Dropout masks depend on the global row, not on the micro-batch split", "[model]") {
  auto backend = std::move(*make_backend("cpu"));
  const GptShape shape = tiny_shape(0.3f);
  const int T = 6;
  const Batch batch = make_batch(4, T, shape.vocab_size, 4);
  Gpt model(shape, *backend);
  auto single = make_single_communicator();
  ShardedParams params(model.layout(), *backend, *single, Strategy::kSingle);
  params.init(shape, 1);
  // One micro-batch of 4 rows vs two of 2 rows (row offsets 0 and 2): same accumulated gradient.
  model.prepare(4, T);
  params.begin_micro_batch(true, true);
  model.forward_backward(params, batch.inputs.data(), batch.targets.data(), 1.0f / (4 * T), {1, 2, 0, true});
  std::vector<float> whole(params.local_grads(), params.local_grads() + params.local_numel());
  model.prepare(2, T);
  params.begin_micro_batch(true, true);
  for (int half = 0; half < 2; ++half) {
    model.forward_backward(params, batch.inputs.data() + half * 2 * T, batch.targets.data() + half * 2 * T,
                           1.0f / (4 * T), {1, 2, half * 2, true});
  }
  double max_diff = 0, max_abs = 0;
  for (int64_t i = 0; i < params.local_numel(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::abs(whole[i] - params.local_grads()[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::abs(whole[i])));
  }
  REQUIRE(max_abs > 0);
  REQUIRE(max_diff <= 1e-5 * max_abs);  // only summation order differs
  // A different step draws a different mask.
  params.begin_micro_batch(true, true);
  model.prepare(4, T);
  const float l1 = model.forward_backward(params, batch.inputs.data(), batch.targets.data(), 1.0f, {1, 2, 0, true});
  const float l2 = model.forward_backward(params, batch.inputs.data(), batch.targets.data(), 1.0f, {1, 3, 0, true});
  REQUIRE(l1 != l2);
}

// Sampling's KV cache: decode at every length, one token at a time or several, gives forward_logits' last row over
// the same tokens. A later prefill at t0 = 0 (the sampler's sliding window past the block size) overwrites the cache.
// Under fp32 compute, and under bf16 compute with the GEMM inputs stored in fp32 or in bf16 (the two dtypes decode's
// buffers take): there an fp32 sum that ends on the other side of a bf16 rounding boundary (the GEMMs of fewer rows
// sum in another order) moves one value by 2^-8 relative, and 2e-3 of the largest logit allows a few such.
TEST_CASE("decode over a KV cache gives forward_logits' last row", "[model]") {
  auto backend = std::move(*make_backend("cpu"));
  backend->set_threads(1);
  GptShape shape = tiny_shape();
  shape.n_embd = 16;
  shape.block_size = 12;
  shape.vocab_size = 37;
  const Batch seq = make_batch(1, 14, shape.vocab_size, 8);
  const std::vector<int32_t>& ids = seq.inputs;
  const StepContext eval{11, 0, 0, false};
  for (const auto& [compute, gemm_inputs] : {std::pair{DType::kF32, DType::kF32}, std::pair{DType::kBF16, DType::kF32},
                                             std::pair{DType::kBF16, DType::kBF16}}) {
    CAPTURE(dtype_name(compute), dtype_name(gemm_inputs));
    backend->set_compute_dtype(compute);
    const double tol = compute == DType::kF32 ? 1e-5 : 2e-3;
    // forward_logits' last row for ids[from, from + len).
    auto reference = [&](int from, int len) {
      Prepared m = prepare_model(*backend, shape, "none", Gpt::kHeadRows, 1, len, gemm_inputs);
      const float* l = m.model->forward_logits(*m.params, ids.data() + from, eval);
      return std::vector<float>(l + static_cast<int64_t>(len - 1) * shape.vocab_size,
                                l + int64_t{len} * shape.vocab_size);
    };
    Prepared m = prepare_model(*backend, shape, "none", Gpt::kHeadRows, 1, 1, gemm_inputs);
    m.model->prepare_decode(shape.block_size);
    auto check = [&](const float* got, const std::vector<float>& want) {
      double scale = 0.0, worst = 0.0;
      for (size_t j = 0; j < want.size(); ++j) {
        scale = std::max(scale, static_cast<double>(std::abs(want[j])));
        const double d = std::abs(static_cast<double>(got[j]) - want[j]);
        if (!(d <= worst)) worst = d;  // NaN too
      }
      INFO("max difference " << worst << " of max |logit| " << scale);
      CHECK(worst <= tol * scale);
    };
    // (t0, n): a prompt of 5, then one token at a time, then 3 at once up to the block size.
    for (const auto& [t0, n] : std::vector<std::pair<int, int>>{{0, 5}, {5, 1}, {6, 1}, {7, 1}, {8, 1}, {9, 3}}) {
      CAPTURE(t0, n);
      check(m.model->decode(*m.params, ids.data() + t0, n, t0), reference(0, t0 + n));
    }
    // The window ids[2, 14): every position new.
    check(m.model->decode(*m.params, ids.data() + 2, 12, 0), reference(2, 12));
    check(m.model->decode(*m.params, ids.data() + 2, 1, 0), reference(2, 1));
  }
}

}  // namespace
}  // namespace gpt
