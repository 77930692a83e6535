// Importing Hugging Face GPT-2 weights (OpenAI's GPT-2 as transformers saves it, or what `checkpoint consolidate
// --out DIR/` exported) as gpt-train's flat fp32 weights, so that a run can fine-tune them (checkpoint.init_from)
// and `sample` can run them. The inverse of consolidate_to_safetensors' mapping (hf_gpt2_tensors): Conv1D weights
// are transposed back to (out, in).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "model/layout.h"

namespace gpt {

struct HfGpt2 {
  GptShape shape;              // from config.json (dropout 0: the fine-tuning run's config sets its own)
  std::vector<float> weights;  // (total numel,) units concatenated in layout order, as load_model's
};

// `path`: a directory holding config.json and model.safetensors (save_pretrained's layout), or a .safetensors file
// with config.json beside it. The tensors may be F32, BF16 or F16 (widened exactly), named as GPT2Model's or with
// GPT2LMHeadModel's "transformer." prefix; the attention's mask buffers (attn.bias, attn.masked_bias) are skipped
// and an lm_head.weight must equal wte.weight (GPT-2's LM head is tied). Errors name the file and the tensor or key:
// a config that is not GPT-2's math (another activation, LayerNorm epsilon or attention scaling), a missing,
// misshapen, unknown or truncated tensor.
Expected<HfGpt2> read_hf_gpt2(const std::string& path);

}  // namespace gpt
