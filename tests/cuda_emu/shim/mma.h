// Emulated nvcuda::wmma (16x16x16; bf16 a/b, float accumulator). Each lane holds 8 elements of the 16x16 tile
// under a scrambled, per-fragment-kind element map (different for matrix_a, matrix_b, accumulator), so a
// kernel that assumed a layout gets wrong answers. Every call is warp-collective: all 32 lanes must arrive
// (checked). load/store check 32-byte pointer alignment and ldm (multiple of 8 for bf16, 4 for float).
// mma_sync: each lane deposits its a, b, c elements into per-warp storage, then computes its d elements in
// double (products of bf16 are exact in fp32) and rounds once to float.
#pragma once
#include <array>
#include <cstdio>
#include <cstdlib>
#include "cuda_bf16.h"
#include "cuda_runtime.h"
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
// map[lane*8 + i] = r*16 + c
inline std::array<int, 256> emu_make_map(uint32_t seed) {
  std::array<int, 256> m;
  for (int i = 0; i < 256; ++i) m[i] = i;
  for (int i = 255; i > 0; --i) {
    seed = seed * 1664525u + 1013904223u;
    const int j = static_cast<int>((seed >> 8) % static_cast<uint32_t>(i + 1));
    std::swap(m[i], m[j]);
  }
  return m;
}
template <class Use> inline const std::array<int, 256>& emu_map();
template <> inline const std::array<int, 256>& emu_map<matrix_a>() { static const auto m = emu_make_map(11); return m; }
template <> inline const std::array<int, 256>& emu_map<matrix_b>() { static const auto m = emu_make_map(22); return m; }
template <> inline const std::array<int, 256>& emu_map<accumulator>() { static const auto m = emu_make_map(33); return m; }

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16);
  static constexpr int num_elements = 8;
  T x[8];
};
inline float emu_to_f(float v) { return v; }
inline float emu_to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
inline void emu_check_ptr(const void* p, unsigned ldm, int elem) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) { std::fprintf(stderr, "EMU: wmma pointer not 32-byte aligned\n"); std::abort(); }
  if (ldm % (16 / elem) != 0) { std::fprintf(stderr, "EMU: wmma ldm %u not a multiple of %d\n", ldm, 16 / elem); std::abort(); }
}
template <class Use, class T, class L>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>);
  emu_warp_converge("load_matrix_sync");
  emu_check_ptr(p, ldm, sizeof(T));
  const auto& m = emu_map<Use>();
  for (int i = 0; i < 8; ++i) {
    const int rc = m[emu_lane * 8 + i], r = rc / 16, c = rc % 16;
    f.x[i] = std::is_same_v<L, row_major> ? p[r * ldm + c] : p[c * ldm + r];
  }
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t lay) {
  emu_warp_converge("load_matrix_sync acc");
  emu_check_ptr(p, ldm, 4);
  const auto& m = emu_map<accumulator>();
  for (int i = 0; i < 8; ++i) {
    const int rc = m[emu_lane * 8 + i], r = rc / 16, c = rc % 16;
    f.x[i] = lay == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t lay) {
  emu_warp_converge("store_matrix_sync");
  emu_check_ptr(p, ldm, 4);
  const auto& m = emu_map<accumulator>();
  for (int i = 0; i < 8; ++i) {
    const int rc = m[emu_lane * 8 + i], r = rc / 16, c = rc % 16;
    (lay == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[i];
  }
}
template <class Use, class T, class L>
void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, T v) {
  emu_warp_converge("fill_fragment");
  for (int i = 0; i < 8; ++i) f.x[i] = v;
}
template <class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  emu_warp_converge("mma_sync");
  const auto &ma = emu_map<matrix_a>(), &mb = emu_map<matrix_b>(), &mc = emu_map<accumulator>();
  for (int i = 0; i < 8; ++i) {
    emu_warp->wa[ma[emu_lane * 8 + i]] = __bfloat162float(a.x[i]);
    emu_warp->wb[mb[emu_lane * 8 + i]] = __bfloat162float(b.x[i]);
    emu_warp->wc[mc[emu_lane * 8 + i]] = c.x[i];
  }
  emu_warp_converge("mma_sync mid");
  float out[8];
  for (int i = 0; i < 8; ++i) {
    const int rc = mc[emu_lane * 8 + i], r = rc / 16, col = rc % 16;
    double acc = emu_warp->wc[rc];
    for (int k = 0; k < 16; ++k) acc += static_cast<double>(emu_warp->wa[r * 16 + k]) * emu_warp->wb[k * 16 + col];
    out[i] = static_cast<float>(acc);
  }
  emu_warp_converge("mma_sync end");
  for (int i = 0; i < 8; ++i) d.x[i] = out[i];
}
}  // namespace nvcuda::wmma
