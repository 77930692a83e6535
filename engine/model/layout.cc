#include "model/layout.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/rng.h"

namespace gpt {

int64_t GptShape::num_params() const { return ModelLayout::build(*this).total_numel; }

const ParamSpec& UnitLayout::param(const std::string& pname) const {
  for (const auto& p : params) {
    if (p.name == pname) return p;
  }
  GPT_CHECK_MSG(false, ("no parameter " + pname + " in unit " + name).c_str());
  __builtin_unreachable();
}

namespace {

void add(UnitLayout& u, std::string name, std::vector<int64_t> shape, InitKind init) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.numel = 1;
  for (int64_t d : p.shape) p.numel *= d;
  p.offset = u.numel;
  p.weight_decay = p.shape.size() >= 2;
  p.init = init;
  u.numel += p.numel;
  u.params.push_back(std::move(p));
}

}  // namespace

ModelLayout ModelLayout::build(const GptShape& s) {
  const int64_t C = s.n_embd;
  ModelLayout m;
  UnitLayout embed{"embed", {}, 0};
  add(embed, "wte", {s.vocab_size, C}, InitKind::kNormal);
  add(embed, "wpe", {s.block_size, C}, InitKind::kNormal);
  m.units.push_back(std::move(embed));
  for (int l = 0; l < s.n_layer; ++l) {
    UnitLayout b{"block." + std::to_string(l), {}, 0};
    add(b, "ln_1.weight", {C}, InitKind::kOnes);
    add(b, "ln_1.bias", {C}, InitKind::kZeros);
    add(b, "attn.qkv.weight", {3 * C, C}, InitKind::kNormal);
    add(b, "attn.qkv.bias", {3 * C}, InitKind::kZeros);
    add(b, "attn.proj.weight", {C, C}, InitKind::kNormalResidual);
    add(b, "attn.proj.bias", {C}, InitKind::kZeros);
    add(b, "ln_2.weight", {C}, InitKind::kOnes);
    add(b, "ln_2.bias", {C}, InitKind::kZeros);
    add(b, "mlp.fc.weight", {4 * C, C}, InitKind::kNormal);
    add(b, "mlp.fc.bias", {4 * C}, InitKind::kZeros);
    add(b, "mlp.proj.weight", {C, 4 * C}, InitKind::kNormalResidual);
    add(b, "mlp.proj.bias", {C}, InitKind::kZeros);
    m.units.push_back(std::move(b));
  }
  UnitLayout head{"head", {}, 0};
  add(head, "ln_f.weight", {C}, InitKind::kOnes);
  add(head, "ln_f.bias", {C}, InitKind::kZeros);
  m.units.push_back(std::move(head));
  for (const auto& u : m.units) m.total_numel += u.numel;
  return m;
}

void init_unit_slice(const UnitLayout& unit, const GptShape& shape, uint64_t seed, int64_t begin, int64_t end,
                     float* out) {
  const float kStd = 0.02f;
  const float kResidualStd = kStd / std::sqrt(2.0f * static_cast<float>(shape.n_layer));
  for (const auto& p : unit.params) {
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    const CounterRng rng(seed, hash_name(unit.name + "." + p.name));
    float* dst = out + (lo - begin);
    switch (p.init) {
      case InitKind::kZeros:
        for (int64_t i = lo; i < hi; ++i) dst[i - lo] = 0.0f;
        break;
      case InitKind::kOnes:
        for (int64_t i = lo; i < hi; ++i) dst[i - lo] = 1.0f;
        break;
      case InitKind::kNormal:
      case InitKind::kNormalResidual: {
        const float std = p.init == InitKind::kNormal ? kStd : kResidualStd;
#pragma omp parallel for schedule(static)
        for (int64_t i = lo; i < hi; ++i) dst[i - lo] = std * rng.normal(static_cast<uint64_t>(i - p.offset));
        break;
      }
    }
  }
}

}  // namespace gpt
