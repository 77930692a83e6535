// The GPT's parameter layout. Parameters are grouped in units: `embed` (wte, wpe), `block.<i>` and
// `head` (ln_f); the LM head is tied to embed.wte. Each unit's parameters live in one flat fp32 buffer
// whose layout (order, shapes, offsets) is a pure function of the model shape: the strategies shard
// these buffers as contiguous slices and checkpoints store them, so resharding is re-slicing.
// Weights are (out_features, in_features), as PyTorch's nn.Linear.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct GptShape {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int block_size = 0;  // T: the longest context
  int vocab_size = 0;  // V: real tokens
  float dropout = 0.0f;
  int64_t num_params() const;
};

enum class InitKind { kNormal, kNormalResidual, kZeros, kOnes };

struct ParamSpec {
  std::string name;  // within the unit, e.g. "attn.qkv.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in elements, within the unit's flat buffer
  int64_t numel = 0;
  bool weight_decay = false;  // AdamW decays 2-D weights only
  InitKind init = InitKind::kZeros;
};

struct UnitLayout {
  std::string name;  // "embed", "block.3", "head"
  std::vector<ParamSpec> params;
  int64_t numel = 0;
  const ParamSpec& param(const std::string& name) const;  // CHECKs that it exists
};

struct ModelLayout {
  std::vector<UnitLayout> units;  // embed, block.0 .. block.L-1, head
  int64_t total_numel = 0;
  static ModelLayout build(const GptShape& shape);
  static constexpr int kEmbedUnit = 0;
  int block_unit(int layer) const { return 1 + layer; }
  int head_unit() const { return static_cast<int>(units.size()) - 1; }
};

// Writes elements [begin, end) of `unit`'s flat buffer into out[0, end-begin) with GPT-2 init: N(0, 0.02),
// residual projections N(0, 0.02/sqrt(2*n_layer)), biases 0, LayerNorm weights 1. Each element comes from
// the counter-based RNG keyed by (seed, unit and parameter name, element index), so any slice can be
// initialised on its own and the weights never depend on layout or ranks.
void init_unit_slice(const UnitLayout& unit, const GptShape& shape, uint64_t seed, int64_t begin, int64_t end,
                     float* out);

}  // namespace gpt
