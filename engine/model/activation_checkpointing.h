// Activation checkpointing policy: which block activations the forward keeps and which the backward
// recomputes. `none` keeps all; `full` keeps only each block's input and recomputes the whole block in
// backward; `every:N` does that for blocks 0, N, 2N, ...; `selective` keeps everything but the cheap
// outputs (LayerNorm outputs and GELU output), recomputed just before the block's backward.
// Recomputation runs the same kernels on the same inputs, so gradients are bitwise those of `none`.
#pragma once

#include <string>

#include "core/status.h"

namespace gpt {

struct ActivationCheckpointing {
  enum class Mode { kNone, kFull, kEveryN, kSelective };
  Mode mode = Mode::kNone;
  int every = 1;

  static Expected<ActivationCheckpointing> parse(const std::string& text);
  bool recompute_block(int layer) const {
    return mode == Mode::kFull || (mode == Mode::kEveryN && layer % every == 0);
  }
  bool selective() const { return mode == Mode::kSelective; }
  std::string to_string() const;
};

}  // namespace gpt
