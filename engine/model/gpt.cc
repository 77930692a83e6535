#include "model/gpt.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"

namespace gpt {

// Per-block activations saved for backward. A block whose activations are recomputed points at the shared
// scratch set; under `selective`, ln_1/ln_2/gelu outputs always point at scratch. ln_1, ln_2 and the GELU output
// are read only by GEMMs and stored in the GEMM input dtype (bf16 under bf16 compute: what the GEMMs would round
// fp32 copies to). qkv, the attention output and the fc output are stored in the compute dtype: the qkv and fc
// GEMMs round their outputs once to bf16 under bf16 compute (llm.c's bf16 activations), attention and the GELU
// read them so, and attention writes its output (the projection's GEMM input) in qkv's dtype. (So do the
// projections, into the shared proj_out that the fused residual + LayerNorm adds to the fp32 residual stream.)
struct BlockActs {
  TensorPtr ln1;       // (B,T,C)
  float* ln1_mean;     // (B,T)
  float* ln1_rstd;     // (B,T)
  TensorPtr qkv;       // (B,T,3C)  the qkv GEMM's output, attention's input: in the compute dtype
  TensorPtr atty;      // (B,T,C)   in qkv's dtype
  float* att;          // attention state, Backend::attention_state_floats (CPU: (B,NH,T,T))
  float* res_mid;      // (B,T,C)  x + attention branch
  TensorPtr ln2;       // (B,T,C)
  float* ln2_mean;     // (B,T)
  float* ln2_rstd;     // (B,T)
  TensorPtr fch;       // (B,T,4C)  the fc GEMM's output, GELU's input: in the compute dtype
  TensorPtr fch_gelu;  // (B,T,4C)
};

struct Gpt::Acts {
  Buffer stored;                   // the kept activations (category: activations)
  Buffer scratch;                  // one block's recompute set + temporaries (activations)
  Buffer grads;                    // activation gradients for backward (workspace)
  Buffer tokens;                   // (B,T) the inputs, on the backend, for embedding forward and backward (activations)
  Buffer targets;                  // (B,T) on the backend (activations)
  std::vector<float> losses_host;  // (loss slots, B,T) per-token losses, copied back for the means
  std::vector<float> mean_losses;  // mean_losses' answer
  std::vector<float> logits_host;  // (B,T,V) forward_logits' copy, unless one unpadded fp32 chunk in host memory
  std::vector<bf16> logits_lo_host;  // a chunk of bf16 logits, copied back to be widened into logits_host
  float* x = nullptr;                // residual stream (L+1, B,T,C): x[0] embedding output, x[l+1] block l output
  std::vector<BlockActs> blocks;
  BlockActs recompute{};
  // (B,T,C) temporary: the projections' output, in the compute dtype (as autocast leaves a Linear's), added to the
  // fp32 residual stream
  TensorPtr proj_out;
  TensorPtr lnf;              // (B,T,C), a GEMM input
  float* lnf_mean = nullptr;  // (B,T)
  float* lnf_rstd = nullptr;  // (B,T)
  // (head rows, logits_stride(V)): one chunk of the LM head's logits, in the compute dtype (the GEMM's output, as
  // PyTorch's autocast leaves it), and their gradient, a GEMM input: in place over the logits, or a buffer of its own
  // where the GEMM input dtype differs.
  TensorPtr logits, dlogits;
  float* losses = nullptr;  // (loss slots, B,T)
  int loss_slots = 1;
  // Set by forward(): the embed unit's wte, the tied LM head's GEMM weight, and the head unit's parameters (as the
  // ParamSource holds them).
  ConstTensorPtr wte;
  ConstTensorPtr head;
  // gradient workspace. The GEMMs' input gradients are in the compute dtype (bf16 under bf16 compute, as PyTorch's
  // autocast leaves a Linear's): dln (the LayerNorms' output gradient), datty (attention's), and d4 (the GELU's
  // output gradient), which is null under a fused GELU backward, which writes d4_lo from the GEMM. d4_lo: the GELU
  // backward's output, the fc GEMM's output gradient, in the GEMM input dtype: d4 itself (in place) where the two
  // dtypes agree. dqkv in qkv's dtype (the compute dtype). dres (the residual stream's) and dtmp stay fp32.
  float *dres = nullptr, *dtmp = nullptr;
  bool fused_dgelu = false;  // Backend::gelu_backward_fused when prepared
  TensorPtr dln, datty, d4, d4_lo, dqkv;
  bf16* dres_lo = nullptr;  // dres in bf16, the projections' output gradient (GEMM inputs in bf16 only)
};

// decode's buffers: the KV cache and one call's activations, for up to max_T tokens (dtypes as in Acts).
struct Gpt::DecodeActs {
  int max_T = 0;
  Buffer memory;    // everything below but the tokens (category: activations)
  Buffer tokens;    // (max_T) the new tokens, on the backend
  TensorPtr cache;  // (L, max_T, 3C) every block's qkv GEMM output at every position: the compute dtype
  float *x = nullptr, *res_mid = nullptr;  // (max_T, C) fp32
  TensorPtr proj_out;                      // (max_T, C) the compute dtype
  TensorPtr ln;                            // (max_T, C) the GEMM input dtype
  TensorPtr atty;                          // (max_T, C) the compute dtype
  TensorPtr fch, fch_gelu;                 // (max_T, 4C) compute, GEMM input dtypes
  TensorPtr logits;                        // (logits_stride(V)) the compute dtype
  std::vector<float> logits_host;
  std::vector<bf16> logits_lo_host;
};

// Parameter pointers of one block, in layout order: fp32, or bf16 when the ParamSource holds bf16 parameters for
// bf16 compute (GEMMs take the weights uncast; the other ops read the LayerNorm parameters and biases widened).
struct Gpt::BlockParams {
  ConstTensorPtr ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
};
// Gradient pointers of one block (fp32, the ParamSource's buffers), in layout order.
struct Gpt::BlockGrads {
  float *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

namespace {

enum DropoutSite : int { kSiteEmbed = 0, kSiteAttention = 1, kSiteAttnResid = 2, kSiteMlpResid = 3 };

// A simple bump allocator over one Buffer: first pass counts, second pass hands out pointers.
class Carver {
 public:
  explicit Carver(Buffer* buf) : base_(buf != nullptr ? buf->as<char>() : nullptr) {}
  TensorPtr take(int64_t n, DType type) {
    char* p = base_ ? base_ + used_ : nullptr;
    used_ += (n * static_cast<int64_t>(dtype_size(type)) + 63) / 64 * 64;  // keep every tensor 64-byte aligned
    return {p, type};
  }
  float* take(int64_t n) { return static_cast<float*>(take(n, DType::kF32).data); }
  int64_t used() const { return used_; }  // bytes

 private:
  char* base_;
  int64_t used_ = 0;
};

}  // namespace

Gpt::Gpt(const GptShape& shape, Backend& backend, ActivationCheckpointing ckpt)
    : shape_(shape), layout_(ModelLayout::build(shape)), be_(backend), ckpt_(ckpt) {
  GPT_CHECK(shape.n_embd % shape.n_head == 0);
}

Gpt::~Gpt() { delete acts_; }

Gpt::BlockParams Gpt::block_params(ConstTensorPtr base) const {
  const UnitLayout& u = layout_.units[1];
  auto p = [&](size_t i) { return base.at(u.params[i].offset); };
  return {p(0), p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8), p(9), p(10), p(11)};
}

Gpt::BlockGrads Gpt::block_grads(float* base) const {
  const UnitLayout& u = layout_.units[1];
  auto p = [&](size_t i) { return base + u.params[i].offset; };
  return {p(0), p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8), p(9), p(10), p(11)};
}

void Gpt::prepare(int B, int T, int loss_slots) {
  GPT_CHECK(loss_slots > 0);
  GPT_CHECK(B > 0 && T > 0 && T <= shape_.block_size);
  const int64_t N = static_cast<int64_t>(B) * T, C = shape_.n_embd, L = shape_.n_layer;
  const DType lo = gemm_input_dtype(), out = be_.compute_dtype();
  // Under a fused GELU backward (the gradient at the GELU's input straight from the projection GEMM's epilogue, in
  // bf16) there is no d4 (the gradient at its output); the planner's activation_bytes counts the same.
  const bool fused_dgelu =
      lo == DType::kBF16 && out == DType::kBF16 && be_.gelu_backward_fused(static_cast<int>(4 * C));
  if (acts_ != nullptr && B == B_ && T == T_ && acts_->fused_dgelu == fused_dgelu && acts_->loss_slots == loss_slots) {
    return;
  }
  delete acts_;
  acts_ = new Acts();
  acts_->fused_dgelu = fused_dgelu;
  acts_->loss_slots = loss_slots;
  B_ = B;
  T_ = T;
  const int64_t att = be_.attention_state_floats(B, T, shape_.n_head);

  // Lays out one block's set; tensors that are not `own`ed alias the scratch set.
  auto carve_block = [&](Carver& c, const BlockActs* scratch, bool keep_all) {
    const bool sel = ckpt_.selective();
    auto aliased = [&](bool cheap) { return scratch != nullptr && (!keep_all || (sel && cheap)); };
    auto own = [&](int64_t n, float* BlockActs::*field, bool cheap) -> float* {
      return aliased(cheap) ? scratch->*field : c.take(n);
    };
    auto own_as = [&](int64_t n, TensorPtr BlockActs::*field, bool cheap, DType type) -> TensorPtr {
      return aliased(cheap) ? scratch->*field : c.take(n, type);
    };
    auto own_lo = [&](int64_t n, TensorPtr BlockActs::*field, bool cheap) { return own_as(n, field, cheap, lo); };
    BlockActs a{};
    a.ln1 = own_lo(N * C, &BlockActs::ln1, true);
    a.ln1_mean = own(N, &BlockActs::ln1_mean, false);
    a.ln1_rstd = own(N, &BlockActs::ln1_rstd, false);
    a.qkv = own_as(3 * N * C, &BlockActs::qkv, false, out);
    a.atty = own_as(N * C, &BlockActs::atty, false, out);
    a.att = own(att, &BlockActs::att, false);
    a.res_mid = own(N * C, &BlockActs::res_mid, false);
    a.ln2 = own_lo(N * C, &BlockActs::ln2, true);
    a.ln2_mean = own(N, &BlockActs::ln2_mean, false);
    a.ln2_rstd = own(N, &BlockActs::ln2_rstd, false);
    a.fch = own_as(4 * N * C, &BlockActs::fch, false, out);
    a.fch_gelu = own_lo(4 * N * C, &BlockActs::fch_gelu, true);
    return a;
  };
  const bool any_scratch = ckpt_.mode != ActivationCheckpointing::Mode::kNone;
  // Two passes: measure, allocate, carve.
  for (int pass = 0; pass < 2; ++pass) {
    Carver sc(pass ? &acts_->scratch : nullptr);
    if (any_scratch) acts_->recompute = carve_block(sc, nullptr, true);
    acts_->proj_out = sc.take(N * C, out);
    Carver st(pass ? &acts_->stored : nullptr);
    acts_->x = st.take((L + 1) * N * C);
    acts_->blocks.clear();
    for (int l = 0; l < L; ++l) {
      acts_->blocks.push_back(carve_block(st, any_scratch ? &acts_->recompute : nullptr, !ckpt_.recompute_block(l)));
    }
    acts_->lnf = st.take(N * C, lo);
    acts_->lnf_mean = st.take(N);
    acts_->lnf_rstd = st.take(N);
    const int64_t head = head_rows(N, head_limit_) * logits_stride(shape_.vocab_size);
    acts_->logits = st.take(head, out);
    acts_->dlogits = lo == out ? acts_->logits : st.take(head, lo);
    acts_->losses = st.take(loss_slots * N);
    Carver gr(pass ? &acts_->grads : nullptr);
    acts_->dres = gr.take(N * C);
    acts_->dtmp = gr.take(N * C);
    acts_->dln = gr.take(N * C, out);
    acts_->d4 = fused_dgelu ? TensorPtr() : gr.take(4 * N * C, out);
    acts_->d4_lo = !fused_dgelu && lo == out ? acts_->d4 : gr.take(4 * N * C, lo);
    acts_->dqkv = gr.take(3 * N * C, out);
    acts_->datty = gr.take(N * C, out);
    acts_->dres_lo = lo == DType::kBF16 ? gr.take(N * C, lo).as_bf16() : nullptr;
    if (pass == 0) {
      acts_->scratch = be_.alloc(sc.used(), MemCategory::kActivations);
      acts_->stored = be_.alloc(st.used(), MemCategory::kActivations);
      acts_->grads = be_.alloc(gr.used(), MemCategory::kWorkspace);
      acts_->tokens = be_.alloc(N * sizeof(int32_t), MemCategory::kActivations);
      acts_->targets = be_.alloc(N * sizeof(int32_t), MemCategory::kActivations);
      acts_->losses_host.assign(loss_slots * N, 0.0f);
      // The backend's own workspaces too, so that no step allocates (ARCHITECTURE invariant 4).
      be_.reserve(B, T, static_cast<int>(C), shape_.n_head, shape_.vocab_size, head_rows(N, head_limit_),
                  shape_.dropout > 0.0f);
    }
  }
}

DropoutMask Gpt::dropout(int site, int layer, const StepContext& ctx, uint64_t per_row) const {
  DropoutMask m;
  if (!ctx.training || shape_.dropout <= 0.0f) return m;
  m.p = shape_.dropout;
  const uint64_t stream = (static_cast<uint64_t>(ctx.step) << 24) ^ (static_cast<uint64_t>(site) << 20) ^
                          static_cast<uint64_t>(layer + 1) ^ 0x6470726f706f7574ull;  // "dropout"
  m.rng = CounterRng(ctx.seed, stream);
  m.base = static_cast<uint64_t>(ctx.row_offset) * per_row;
  return m;
}

void Gpt::block_forward(int l, const BlockParams& p, const float* x_in, bool recompute, const StepContext& ctx) {
  const BlockActs& a = acts_->blocks[l];
  const int64_t N = static_cast<int64_t>(B_) * T_;
  const int C = shape_.n_embd, NH = shape_.n_head;
  if (recompute) be_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_in, p.ln1w, p.ln1b, N, C);
  be_.matmul_forward(a.qkv, a.ln1, p.qkvw, p.qkvb, N, C, 3 * C);
  be_.attention_forward(a.atty, a.att, a.qkv, B_, T_, C, NH,
                        dropout(kSiteAttention, l, ctx, static_cast<uint64_t>(NH) * T_ * T_));
  be_.matmul_forward(acts_->proj_out, a.atty, p.projw, p.projb, N, C, C);
  be_.residual_layernorm_forward(a.res_mid, a.ln2, a.ln2_mean, a.ln2_rstd, x_in, acts_->proj_out, p.ln2w, p.ln2b, N, C,
                                 dropout(kSiteAttnResid, l, ctx, static_cast<uint64_t>(T_) * C));
  be_.matmul_gelu_forward(a.fch, a.fch_gelu, a.ln2, p.fcw, p.fcb, N, C, 4 * C);
  if (recompute) return;  // the block's output is kept
  be_.matmul_forward(acts_->proj_out, a.fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
}

void Gpt::block_output_layernorm(int l, float* x_out, TensorPtr out, float* mean, float* rstd, ConstTensorPtr weight,
                                 ConstTensorPtr bias, const StepContext& ctx) {
  const int64_t N = static_cast<int64_t>(B_) * T_;
  const int C = shape_.n_embd;
  be_.residual_layernorm_forward(x_out, out, mean, rstd, acts_->blocks[l].res_mid, acts_->proj_out, weight, bias, N, C,
                                 dropout(kSiteMlpResid, l, ctx, static_cast<uint64_t>(T_) * C));
}

void Gpt::forward(ParamSource& params, const int32_t* inputs, const StepContext& ctx) {
  const int64_t N = static_cast<int64_t>(B_) * T_;
  const int C = shape_.n_embd, L = shape_.n_layer;
  be_.to_device(acts_->tokens.data(), inputs, N * sizeof(int32_t));
  const ConstTensorPtr embed = params.acquire(ModelLayout::kEmbedUnit);
  const UnitLayout& eu = layout_.units[ModelLayout::kEmbedUnit];
  acts_->wte = embed.at(eu.params[0].offset);
  be_.embedding_forward(acts_->x, acts_->tokens.as<int32_t>(), acts_->wte, embed.at(eu.params[1].offset), B_, T_, C);
  be_.dropout_forward(acts_->x, N * C, dropout(kSiteEmbed, 0, ctx, static_cast<uint64_t>(T_) * C));
  // Each block's first op also finishes the block before it: x[l] = res_mid + dropout(proj_out) of block l - 1,
  // fused with block l's ln_1 (only block l's parameters are needed, so units are acquired one at a time).
  for (int l = 0; l < L; ++l) {
    const int unit = layout_.block_unit(l);
    const BlockParams p = block_params(params.acquire(unit));
    const BlockActs& a = acts_->blocks[l];
    float* x_in = acts_->x + l * N * C;
    if (l == 0) {
      be_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_in, p.ln1w, p.ln1b, N, C);
    } else {
      block_output_layernorm(l - 1, x_in, a.ln1, a.ln1_mean, a.ln1_rstd, p.ln1w, p.ln1b, ctx);
    }
    block_forward(l, p, x_in, /*recompute=*/false, ctx);
    params.release(unit);
  }
  const ConstTensorPtr head = params.acquire(layout_.head_unit());
  acts_->head = head;
  float* x_last = acts_->x + L * N * C;
  if (L == 0) {
    be_.layernorm_forward(acts_->lnf, acts_->lnf_mean, acts_->lnf_rstd, x_last, head, head.at(C), N, C);
  } else {
    block_output_layernorm(L - 1, x_last, acts_->lnf, acts_->lnf_mean, acts_->lnf_rstd, head, head.at(C), ctx);
  }
}

void Gpt::head_forward(int64_t r0, int64_t rows) {
  const int C = shape_.n_embd;
  be_.matmul_forward(acts_->logits, acts_->lnf.at(r0 * C), acts_->wte, nullptr, rows, C, shape_.vocab_size,
                     logits_stride(shape_.vocab_size));
}

void Gpt::set_head_rows(int64_t limit) {
  GPT_CHECK(limit > 0);
  head_limit_ = limit;
  delete acts_;  // prepare() lays the activations out again
  acts_ = nullptr;
}

void Gpt::set_gemm_input_dtype(DType type) {
  GPT_CHECK(type == DType::kF32 || type == DType::kBF16);
  gemm_input_dtype_ = type;
  delete acts_;
  acts_ = nullptr;
  dec_.reset();  // prepare_decode lays its buffers out again too
}

DType Gpt::gemm_input_dtype() const { return gemm_input_dtype_ ? *gemm_input_dtype_ : be_.compute_dtype(); }

const std::vector<float>& Gpt::mean_losses(int n) {
  GPT_CHECK(acts_ != nullptr && n > 0 && n <= acts_->loss_slots);
  const size_t N = static_cast<size_t>(B_) * T_;
  std::vector<float>& h = acts_->losses_host;
  be_.to_host(h.data(), acts_->losses, n * N * sizeof(float));
  std::vector<float>& means = acts_->mean_losses;
  means.resize(static_cast<size_t>(n));
  for (size_t slot = 0; slot < means.size(); ++slot) {
    double s = 0.0;  // in token order
    for (size_t i = slot * N; i < (slot + 1) * N; ++i) s += h[i];
    means[slot] = static_cast<float>(s / static_cast<double>(N));
  }
  return means;
}

const int32_t* Gpt::upload_targets(const int32_t* targets) {
  be_.to_device(acts_->targets.data(), targets, static_cast<size_t>(B_) * T_ * sizeof(int32_t));
  return acts_->targets.as<int32_t>();
}

float Gpt::forward_loss(ParamSource& params, const int32_t* inputs, const int32_t* targets, const StepContext& ctx) {
  GPT_CHECK(acts_ != nullptr);
  forward(params, inputs, ctx);
  const int64_t N = static_cast<int64_t>(B_) * T_, chunk = head_rows(N, head_limit_);
  const int32_t* tgt = upload_targets(targets);
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    head_forward(r0, rows);
    be_.crossentropy_forward_backward(acts_->losses + r0, nullptr, acts_->logits, tgt + r0, rows, shape_.vocab_size,
                                      static_cast<int>(logits_stride(shape_.vocab_size)), 0.0f);
  }
  params.release(layout_.head_unit());
  params.release(ModelLayout::kEmbedUnit);
  return mean_losses(1)[0];
}

const float* Gpt::forward_logits(ParamSource& params, const int32_t* inputs, const StepContext& ctx) {
  GPT_CHECK(acts_ != nullptr);
  forward(params, inputs, ctx);
  const int64_t N = static_cast<int64_t>(B_) * T_, chunk = head_rows(N, head_limit_), V = shape_.vocab_size;
  const int64_t Vp = logits_stride(V);
  const bool lo = acts_->logits.is_bf16();
  if (be_.host_memory() && chunk == N && Vp == V && !lo) {  // one unpadded fp32 chunk in host memory: no copy
    head_forward(0, N);
    params.release(layout_.head_unit());
    params.release(ModelLayout::kEmbedUnit);
    return acts_->logits.as_f32();
  }
  // fp32 chunks are copied whole into place and their real columns moved together afterwards (a row only ever
  // moves left); bf16 ones through a chunk-sized copy, widened row by row.
  std::vector<float>& h = acts_->logits_host;
  std::vector<bf16>& h_lo = acts_->logits_lo_host;
  h.resize(static_cast<size_t>(N * (lo ? V : Vp)));
  if (lo) h_lo.resize(static_cast<size_t>(chunk * Vp));
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    head_forward(r0, rows);
    if (!lo) {
      be_.to_host(h.data() + r0 * Vp, acts_->logits.data, static_cast<size_t>(rows * Vp) * sizeof(float));
      continue;
    }
    be_.to_host(h_lo.data(), acts_->logits.data, static_cast<size_t>(rows * Vp) * sizeof(bf16));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < V; ++j) h[(r0 + i) * V + j] = bf16_to_f32(h_lo[i * Vp + j]);
    }
  }
  if (!lo) {
    for (int64_t i = 1; i < N; ++i) {
      std::memmove(h.data() + i * V, h.data() + i * Vp, static_cast<size_t>(V) * sizeof(float));
    }
    h.resize(static_cast<size_t>(N * V));
  }
  params.release(layout_.head_unit());
  params.release(ModelLayout::kEmbedUnit);
  return h.data();
}

void Gpt::prepare_decode(int max_T) {
  GPT_CHECK(max_T > 0 && max_T <= shape_.block_size);
  if (dec_ != nullptr && dec_->max_T == max_T) return;
  dec_ = std::make_unique<DecodeActs>();
  DecodeActs& d = *dec_;
  d.max_T = max_T;
  const int64_t N = max_T, C = shape_.n_embd, L = shape_.n_layer;
  const DType lo = gemm_input_dtype(), out = be_.compute_dtype();
  for (int pass = 0; pass < 2; ++pass) {
    Carver c(pass ? &d.memory : nullptr);
    d.cache = c.take(L * N * 3 * C, out);
    d.x = c.take(N * C);
    d.res_mid = c.take(N * C);
    d.proj_out = c.take(N * C, out);
    d.ln = c.take(N * C, lo);
    d.atty = c.take(N * C, out);
    d.fch = c.take(4 * N * C, out);
    d.fch_gelu = c.take(4 * N * C, lo);
    d.logits = c.take(logits_stride(shape_.vocab_size), out);
    if (pass == 0) d.memory = be_.alloc(c.used(), MemCategory::kActivations);
  }
  d.tokens = be_.alloc(N * sizeof(int32_t), MemCategory::kActivations);
  be_.reserve(1, max_T, static_cast<int>(C), shape_.n_head, shape_.vocab_size, 1, false);
}

// forward() for rows [t0, t0 + n) of one sequence: the same ops, but each block's qkv GEMM writes into the cache and
// attention reads every cached position; the LM head runs on the last row only.
const float* Gpt::decode(ParamSource& params, const int32_t* tokens, int n, int t0) {
  GPT_CHECK(dec_ != nullptr && n >= 1 && t0 >= 0 && t0 + n <= dec_->max_T);
  DecodeActs& d = *dec_;
  const int C = shape_.n_embd, NH = shape_.n_head, L = shape_.n_layer, V = shape_.vocab_size;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const DropoutMask none;
  be_.to_device(d.tokens.data(), tokens, static_cast<size_t>(n) * sizeof(int32_t));
  const ConstTensorPtr embed = params.acquire(ModelLayout::kEmbedUnit);
  const UnitLayout& eu = layout_.units[ModelLayout::kEmbedUnit];
  const ConstTensorPtr wte = embed.at(eu.params[0].offset);
  be_.embedding_forward(d.x, d.tokens.as<int32_t>(), wte, embed.at(eu.params[1].offset + int64_t{t0} * C), 1, n, C);
  // As in forward(): each block's first op finishes the block before it (x = res_mid + proj_out), fused with its ln_1.
  for (int l = 0; l < L; ++l) {
    const int unit = layout_.block_unit(l);
    const BlockParams p = block_params(params.acquire(unit));
    if (l == 0) {
      be_.layernorm_forward(d.ln, nullptr, nullptr, d.x, p.ln1w, p.ln1b, n, C);
    } else {
      be_.residual_layernorm_forward(d.x, d.ln, nullptr, nullptr, d.res_mid, d.proj_out, p.ln1w, p.ln1b, n, C, none);
    }
    const TensorPtr cache = d.cache.at(int64_t{l} * d.max_T * C3);
    be_.matmul_forward(cache.at(t0 * C3), d.ln, p.qkvw, p.qkvb, n, C, 3 * C);
    be_.attention_forward_rows(d.atty, cache, t0 + n, t0, C, NH);
    be_.matmul_forward(d.proj_out, d.atty, p.projw, p.projb, n, C, C);
    be_.residual_layernorm_forward(d.res_mid, d.ln, nullptr, nullptr, d.x, d.proj_out, p.ln2w, p.ln2b, n, C, none);
    be_.matmul_gelu_forward(d.fch, d.fch_gelu, d.ln, p.fcw, p.fcb, n, C, 4 * C);
    be_.matmul_forward(d.proj_out, d.fch_gelu, p.fcprojw, p.fcprojb, n, 4 * C, C);
    params.release(unit);
  }
  const ConstTensorPtr head = params.acquire(layout_.head_unit());
  if (L == 0) {
    be_.layernorm_forward(d.ln, nullptr, nullptr, d.x, head, head.at(C), n, C);
  } else {
    be_.residual_layernorm_forward(d.x, d.ln, nullptr, nullptr, d.res_mid, d.proj_out, head, head.at(C), n, C, none);
  }
  be_.matmul_forward(d.logits, d.ln.at(int64_t{n - 1} * C), wte, nullptr, 1, C, V, logits_stride(V));
  d.logits_host.resize(static_cast<size_t>(V));
  if (d.logits.is_bf16()) {
    d.logits_lo_host.resize(static_cast<size_t>(V));
    be_.to_host(d.logits_lo_host.data(), d.logits.data, static_cast<size_t>(V) * sizeof(bf16));
    for (int j = 0; j < V; ++j) d.logits_host[j] = bf16_to_f32(d.logits_lo_host[j]);
  } else {
    be_.to_host(d.logits_host.data(), d.logits.data, static_cast<size_t>(V) * sizeof(float));
  }
  params.release(layout_.head_unit());
  params.release(ModelLayout::kEmbedUnit);
  return d.logits_host.data();
}

// Without dropout its backward is the identity: dres itself, with no copy (GPT-2 pretraining runs at p = 0).
const float* Gpt::dropout_grad(const float* dres, const DropoutMask& drop) {
  if (!drop.active()) return dres;
  be_.dropout_backward(acts_->dtmp, dres, static_cast<int64_t>(B_) * T_ * shape_.n_embd, drop);
  return acts_->dtmp;
}

// Without dropout a projection's output gradient is dres itself, and under bf16 GEMM inputs the LayerNorm backward
// that last accumulated into dres also left it in bf16 (dres_lo): the GEMMs take that, uncast. (Every dropout
// site is active or none is: dropout() depends on the site only for the mask's stream.)
bf16* Gpt::residual_grad_lo(const StepContext& ctx) const {
  return dropout(kSiteMlpResid, 0, ctx, 0).active() ? nullptr : acts_->dres_lo;
}
ConstTensorPtr Gpt::projection_dout(const float* dres, const DropoutMask& drop, const StepContext& ctx) {
  if (bf16* lo = residual_grad_lo(ctx)) return ConstTensorPtr(lo);
  return dropout_grad(dres, drop);
}

void Gpt::block_backward(int l, const BlockParams& p, const BlockGrads& g, const float* x_in, const StepContext& ctx) {
  const BlockActs& a = acts_->blocks[l];
  const int64_t N = static_cast<int64_t>(B_) * T_;
  const int C = shape_.n_embd, NH = shape_.n_head;
  if (ckpt_.recompute_block(l)) {
    block_forward(l, p, x_in, /*recompute=*/true, ctx);
  } else if (ckpt_.selective()) {
    be_.layernorm_forward(a.ln1, nullptr, nullptr, x_in, p.ln1w, p.ln1b, N, C);
    be_.layernorm_forward(a.ln2, nullptr, nullptr, a.res_mid, p.ln2w, p.ln2b, N, C);
    be_.gelu_forward(a.fch_gelu, a.fch, N * 4 * C);
  }
  float* dres = acts_->dres;
  const ConstTensorPtr dmlp = projection_dout(dres, dropout(kSiteMlpResid, l, ctx, static_cast<uint64_t>(T_) * C), ctx);
  // The fc bias's gradient comes with the GELU's backward (which may sum it as it writes d4_lo).
  be_.matmul_backward_gelu(acts_->d4_lo, g.fcb, acts_->d4, g.fcprojw, g.fcprojb, dmlp, a.fch_gelu, p.fcprojw, a.fch, N,
                           4 * C, C);
  be_.matmul_backward(acts_->dln, g.fcw, nullptr, acts_->d4_lo, a.ln2, p.fcw, N, C, 4 * C);
  be_.layernorm_backward(dres, g.ln2w, g.ln2b, acts_->dln, a.res_mid, p.ln2w, a.ln2_mean, a.ln2_rstd, N, C,
                         residual_grad_lo(ctx));
  const ConstTensorPtr dattn =
      projection_dout(dres, dropout(kSiteAttnResid, l, ctx, static_cast<uint64_t>(T_) * C), ctx);
  be_.matmul_backward(acts_->datty, g.projw, g.projb, dattn, a.atty, p.projw, N, C, C);
  // The qkv bias's gradient comes with the attention's backward (which may sum it as it writes dqkv).
  be_.attention_backward(acts_->dqkv, acts_->datty, a.qkv, a.atty, a.att, B_, T_, C, NH,
                         dropout(kSiteAttention, l, ctx, static_cast<uint64_t>(NH) * T_ * T_), g.qkvb);
  be_.matmul_backward(acts_->dln, g.qkvw, nullptr, acts_->dqkv, a.ln1, p.qkvw, N, C, 3 * C);
  // Block 0's input gradient goes to the embedding backward, in fp32 only.
  be_.layernorm_backward(dres, g.ln1w, g.ln1b, acts_->dln, x_in, p.ln1w, a.ln1_mean, a.ln1_rstd, N, C,
                         l > 0 ? residual_grad_lo(ctx) : nullptr);
}

float Gpt::forward_backward(ParamSource& params, const int32_t* inputs, const int32_t* targets, float loss_scale,
                            const StepContext& ctx) {
  forward_backward_into(params, inputs, targets, loss_scale, ctx, 0);
  return mean_losses(1)[0];
}

void Gpt::forward_backward_into(ParamSource& params, const int32_t* inputs, const int32_t* targets, float loss_scale,
                                const StepContext& ctx, int slot) {
  GPT_CHECK(acts_ != nullptr && slot >= 0 && slot < acts_->loss_slots);
  forward(params, inputs, ctx);
  const int64_t N = static_cast<int64_t>(B_) * T_;
  const int C = shape_.n_embd, V = shape_.vocab_size;
  const int64_t Vp = logits_stride(V);
  // Head: logits = ln_f(x_L) @ wte^T, chunk by chunk: forward, cross-entropy with dlogits in place, and the
  // backward GEMMs (dln_f rows; wte's gradient accumulates into the embed unit, which stays acquired).
  const UnitLayout& eu = layout_.units[ModelLayout::kEmbedUnit];
  float* dembed = params.grads(ModelLayout::kEmbedUnit);
  const int32_t* tgt = upload_targets(targets);
  const int64_t chunk = head_rows(N, head_limit_);
  float* losses = acts_->losses + slot * N;
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    head_forward(r0, rows);
    be_.crossentropy_forward_backward(losses + r0, acts_->dlogits, acts_->logits, tgt + r0, rows, V,
                                      static_cast<int>(Vp), loss_scale);
    be_.matmul_backward(acts_->dln.at(r0 * C), dembed + eu.params[0].offset, nullptr, acts_->dlogits,
                        acts_->lnf.at(r0 * C), acts_->wte, rows, C, V, Vp);
  }
  const int head = layout_.head_unit();
  const ConstTensorPtr hp = acts_->head;
  float* hg = params.grads(head);
  be_.fill_zero(acts_->dres, N * C);
  be_.layernorm_backward(acts_->dres, hg, hg + C, acts_->dln, acts_->x + shape_.n_layer * N * C, hp, acts_->lnf_mean,
                         acts_->lnf_rstd, N, C, shape_.n_layer > 0 ? residual_grad_lo(ctx) : nullptr);
  params.grads_done(head);
  params.release(head);

  for (int l = shape_.n_layer - 1; l >= 0; --l) {
    const int unit = layout_.block_unit(l);
    const BlockParams p = block_params(params.acquire(unit));
    const BlockGrads g = block_grads(params.grads(unit));
    block_backward(l, p, g, acts_->x + l * N * C, ctx);
    params.grads_done(unit);
    params.release(unit);
  }

  const float* dx = dropout_grad(acts_->dres, dropout(kSiteEmbed, 0, ctx, static_cast<uint64_t>(T_) * C));
  be_.embedding_backward(dembed + eu.params[0].offset, dembed + eu.params[1].offset, dx, acts_->tokens.as<int32_t>(),
                         B_, T_, C);
  params.grads_done(ModelLayout::kEmbedUnit);
  params.release(ModelLayout::kEmbedUnit);
}

}  // namespace gpt
