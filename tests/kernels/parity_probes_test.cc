// The instruction probes (tests/kernels/*_probe.{h,cu}): mma.sync, ldmatrix, cvt.bf16x2, cp.async, wgmma and
// mbarrier alone, against the PTX ISA's tables, so that a failing kernel can be told from a misread instruction.
#include <bit>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/parity_util.h"
#if defined(GPT_PARITY_EMULATED) || defined(GPT_WITH_CUDA)
#include "kernels/mbarrier_probe.h"
#include "kernels/mma_probe.h"  // in the emulator's binary its conversion (gpt::cuda_emu)
#include "kernels/wgmma_probe.h"
#endif

namespace gpt {
namespace {

using namespace parity;

#ifdef GPT_PARITY_EMULATED
namespace cuda_probe = cuda_emu;
#elif defined(GPT_WITH_CUDA)
namespace cuda_probe = cuda;
#endif

// The PTX probe (tests/kernels/mma_probe.h): the instructions under the mma.sync attention, alone. Every value is
// exact (small integers: every product and sum fits fp32), so each output must match its table bit for bit. When
// the attention cases (parity_attention_test.cc) fail on a GPU and this passes, the fault is in a kernel, not in an
// instruction's layout.
TEST_CASE("PTX probe: mma.sync, ldmatrix, cvt.bf16x2 and cp.async follow the PTX ISA's fragment tables", "[cuda]") {
#if defined(GPT_PARITY_EMULATED) || defined(GPT_WITH_CUDA)
  if (cuda_or_skip("PTX probe") == nullptr) return;
  uint32_t state = 12345u;
  auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  auto small = [&] { return static_cast<float>(static_cast<int>(next() >> 24) % 9 - 4); };  // -4 .. 4
  auto bits = [](float x) { return f32_to_bf16(x).bits; };
  auto value = [](uint16_t b) { return bf16_to_f32(bf16{b}); };
  cuda_probe::MmaProbeIn in;
  for (auto* m : {&in.a, &in.b, &in.kt}) {
    for (int e = 0; e < 256; ++e) m->push_back(bits(small()));
  }
  for (int e = 0; e < 128; ++e) in.c.push_back(2.0f * small());
  for (int e = 0; e < 256; ++e) in.codes.push_back(static_cast<uint16_t>(0x1000 + e));  // (row, column) in the bits
  for (int l = 0; l < 16; ++l) {
    in.lo.push_back(1.0f + static_cast<float>(l) / 1024.0f);  // lane 4: 1 + 2^-8, a tie (to even: 1)
    in.hi.push_back(-3.0f - static_cast<float>(l) / 512.0f - 1.0f / 4096.0f);
  }
  // Lanes 16-31: NaNs with payloads, infinities, zeros, subnormals (a tie among them), the largest finite values
  // (rounding to infinity), ties either way; hi the same list turned by 5, so NaNs meet numbers in a pair.
  const uint32_t special[16] = {0x7fc00000u, 0x7f812345u, 0xffc00001u, 0x7f800000u, 0xff800000u, 0x00000000u,
                                0x80000000u, 0x00000001u, 0x00018000u, 0x807fffffu, 0x7f7fffffu, 0x7f7f8000u,
                                0x3f808000u, 0x3f818000u, 0xc0a08001u, 0x3effffffu};
  for (int l = 0; l < 16; ++l) {
    in.lo.push_back(std::bit_cast<float>(special[l]));
    in.hi.push_back(std::bit_cast<float>(special[(l + 5) % 16]));
  }
  for (int e = 0; e < 256; ++e) in.copy.push_back(static_cast<uint16_t>(next() >> 16));
  const cuda_probe::MmaProbeOut out = cuda_probe::run_mma_probe(in);

  // Mismatches against `want`, the first one printed.
  auto show = [](auto v) {
    char buf[64];
    if constexpr (std::is_same_v<decltype(v), float>) {
      std::snprintf(buf, sizeof buf, "%g (0x%08x)", static_cast<double>(v), std::bit_cast<uint32_t>(v));
    } else {
      std::snprintf(buf, sizeof buf, "0x%x", static_cast<unsigned>(v));
    }
    return std::string(buf);
  };
  auto mismatches = [&](const char* what, const auto& got, const auto& want) {
    REQUIRE(got.size() == want.size());
    int n = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(got[i])) != 0 && n++ == 0) {
        std::printf("PTX probe: %s: first difference at %zu: got %s, want %s\n", what, i, show(got[i]).c_str(),
                    show(want[i]).c_str());
      }
    }
    return n;
  };
  // D = A B + C, n-tile by n-tile, with B from b (k x n) or from kt^T.
  auto product = [&](bool from_kt) {
    std::vector<float> d(256);
    for (int nt = 0; nt < 2; ++nt) {
      for (int r = 0; r < 16; ++r) {
        for (int c = 0; c < 8; ++c) {
          const int n = 8 * nt + c;
          double s = in.c[static_cast<size_t>(r * 8 + c)];
          for (int k = 0; k < 16; ++k) {
            s += static_cast<double>(value(in.a[static_cast<size_t>(r * 16 + k)])) *
                 value(from_kt ? in.kt[static_cast<size_t>(n * 16 + k)] : in.b[static_cast<size_t>(k * 16 + n)]);
          }
          d[static_cast<size_t>((nt * 16 + r) * 8 + c)] = static_cast<float>(s);
        }
      }
    }
    return d;
  };
  CHECK(mismatches("mma.sync, fragments by the tables", out.d_direct, product(false)) == 0);
  CHECK(mismatches("mma.sync, ldmatrix A and ldmatrix.trans B", out.d_trans, product(false)) == 0);
  CHECK(mismatches("mma.sync, ldmatrix A and ldmatrix B (kt^T)", out.d_kt, product(true)) == 0);
  // ldmatrix: register m of lane 4 r + q from matrix m (rows 8 (m % 2).., columns 8 (m / 2).. of the codes).
  std::vector<uint32_t> ld, ld_trans;
  for (int lane = 0; lane < 32; ++lane) {
    const int r = lane / 4, q = lane % 4;
    for (int m = 0; m < 4; ++m) {
      auto code = [&](int row, int col) {
        return static_cast<uint32_t>(in.codes[static_cast<size_t>((8 * (m % 2) + row) * 16 + 8 * (m / 2) + col)]);
      };
      ld.push_back(code(r, 2 * q) | code(r, 2 * q + 1) << 16);
      ld_trans.push_back(code(2 * q, r) | code(2 * q + 1, r) << 16);
    }
  }
  CHECK(mismatches("ldmatrix.x4", out.ld, ld) == 0);
  CHECK(mismatches("ldmatrix.x4.trans", out.ld_trans, ld_trans) == 0);
  // Both against f32_to_bf16 (bf16_bits_nearest); pack_bf16x2 (the attention's) only where no NaN is in the pair
  // (cvt gives the canonical NaN), bf16x2_nearest (every kernel's bf16 store) everywhere.
  std::vector<uint32_t> nearest, packed_got, packed_want;
  for (size_t l = 0; l < 32; ++l) {
    nearest.push_back(static_cast<uint32_t>(bits(in.lo[l])) | static_cast<uint32_t>(bits(in.hi[l])) << 16);
    if (!std::isnan(in.lo[l]) && !std::isnan(in.hi[l])) {
      packed_want.push_back(nearest.back());
      packed_got.push_back(out.packed[l]);
    }
  }
  REQUIRE(packed_want.size() >= 16);
  CHECK(mismatches("cvt.rn.bf16x2.f32 (lo in the low half)", packed_got, packed_want) == 0);
  CHECK(mismatches("bf16x2_nearest (cvt; NaNs by the integer path)", out.nearest, nearest) == 0);
  std::vector<uint16_t> copied(in.copy);
  for (int lane = 1; lane < 32; lane += 2) std::fill_n(copied.begin() + 8 * lane, 8, uint16_t{0});
  CHECK(mismatches("cp.async (16 bytes, or zero-filled)", out.copied, copied) == 0);
#else
  std::printf("SKIPPED PTX probe: built without CUDA\n");
#endif
}

// The wgmma probe (tests/kernels/wgmma_probe.h): wgmma m64n64k16 over 128-byte-swizzled shared tiles, alone, on an
// sm_90 GPU (the instruction exists there only) or in the emulator. Exact as above (small integers).
TEST_CASE("wgmma probe: descriptors, swizzle and fragments follow the PTX ISA's tables", "[cuda]") {
#if defined(GPT_PARITY_EMULATED) || defined(GPT_WITH_CUDA)
  if (cuda_or_skip("wgmma probe") == nullptr) return;
  if (!cuda_probe::wgmma_probe_supported()) {
    std::printf("SKIPPED wgmma probe: the GPU is not sm_90 (wgmma is an sm_90a instruction)\n");
    return;
  }
  uint32_t state = 777u;
  auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  auto small = [&] { return static_cast<float>(static_cast<int>(next() >> 24) % 7 - 3); };  // -3 .. 3
  auto value = [](uint16_t b) { return bf16_to_f32(bf16{b}); };
  cuda_probe::WgmmaProbeIn in;
  for (auto* m : {&in.a, &in.kt, &in.v, &in.at}) {
    for (int e = 0; e < 4096; ++e) m->push_back(f32_to_bf16(small()).bits);
  }
  const cuda_probe::WgmmaProbeOut out = cuda_probe::run_wgmma_probe(in);
  // D = A B over k < 64 for n < N: A = a (or at^T), B = kt^T (or v).
  auto check = [&](const char* what, const std::vector<float>& got, int N, bool from_at, bool from_v) {
    REQUIRE(got.size() == static_cast<size_t>(64 * N));
    int wrong = 0;
    for (int m = 0; m < 64; ++m) {
      for (int n = 0; n < N; ++n) {
        double want = 0.0;
        for (int k = 0; k < 64; ++k) {
          want += static_cast<double>(
                      value(from_at ? in.at[static_cast<size_t>(k * 64 + m)] : in.a[static_cast<size_t>(m * 64 + k)])) *
                  value(from_v ? in.v[static_cast<size_t>(k * 64 + n)] : in.kt[static_cast<size_t>(n * 64 + k)]);
        }
        const float g = got[static_cast<size_t>(m * N + n)];
        if (g != static_cast<float>(want) && wrong++ < 4) {
          std::printf("wgmma probe: %s: D[%d][%d] = %g, want %g\n", what, m, n, static_cast<double>(g), want);
        }
      }
    }
    return wrong;
  };
  CHECK(check("A, K-major B^T from shared memory (S = Q K^T)", out.d_ss, 64, false, false) == 0);
  CHECK(check("A from registers, MN-major B (O = P V)", out.d_rs, 64, false, true) == 0);
  CHECK(check("m64n32k16, K-major A and B^T from shared memory", out.d_32, 32, false, false) == 0);
  CHECK(check("MN-major A and B from shared memory (dQ = dS K from dS^T)", out.d_tt, 64, true, true) == 0);
#else
  std::printf("SKIPPED wgmma probe: built without CUDA\n");
#endif
}

// The mbarrier probe (tests/kernels/mbarrier_probe.h): the warp-specialised kernels' synchronisation alone, on an
// sm_90 GPU or in the emulator. [ws]: scripts/gpu/check.sh runs it with the warp-specialised cases, apart (a wait that
// never ends there would otherwise take the other cases' step with it). When those cases fail and this passes, the
// fault is in a kernel, not in mbarrier_ptx.cuh.
TEST_CASE("mbarrier probe: a producer warp's ring of stages, and named barriers, as mbarrier_ptx.cuh says",
          "[cuda][ws]") {
#if defined(GPT_PARITY_EMULATED) || defined(GPT_WITH_CUDA)
  if (cuda_or_skip("mbarrier probe") == nullptr) return;
  if (!cuda_probe::wgmma_probe_supported()) {
    std::printf("SKIPPED mbarrier probe: the GPU is not sm_90 (the probe is built for sm_90a)\n");
    return;
  }
  std::vector<float> src(128 * cuda_probe::kMbarrierProbeTiles);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) + 0.25f;
  const cuda_probe::MbarrierProbeOut out = cuda_probe::run_mbarrier_probe(src);
  CHECK(out.copied == src);  // every tile's cp.async landed before its consumers' reads
  std::vector<float> stored;
  for (int t = 0; t < cuda_probe::kMbarrierProbeTiles; ++t) {
    for (int w = 0; w < 4; ++w) {
      for (int lane = 0; lane < 32; ++lane) stored.push_back(static_cast<float>(t * 1000 + (lane ^ w)));
    }
  }
  CHECK(out.stored == stored);  // the producer's plain stores, released by its arrival
  CHECK(out.named == std::vector<float>{3.0f, 4.0f, 5.0f, 2.0f, 77.0f, 77.0f, 77.0f, 77.0f});
#else
  std::printf("SKIPPED mbarrier probe: built without CUDA\n");
#endif
}

}  // namespace
}  // namespace gpt
