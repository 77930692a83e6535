// Emulated PTX warp-level matrix instructions and cp.async for kernels/cuda/mma_ptx.cuh, in the register layouts
// the PTX ISA documents (mma_ptx.cuh spells them out), so a kernel that indexes fragments wrongly gets wrong
// results here as on a GPU.
//  - mma.sync and ldmatrix are warp collectives: every lane deposits its part in per-warp storage, all 32 must
//    arrive at the same call (checked, as for shuffles), then each computes or reads its own registers. mma.sync
//    sums in double and rounds once to fp32 (bf16 products are exact in fp32; the tensor cores' own rounding of
//    the sum is not modelled). ldmatrix checks that every row address it uses is 16-byte aligned.
//  - A cp.async may land any time between the call and the wait that retires its group. So the emulation writes
//    NaN to the destination at the call (a warp still reading the tile there, because a barrier is missing before
//    the refill, reads NaN) and performs the copy when the thread's cp_async_wait retires the group (source read
//    then, destination written then: reading before the wait, or another thread's copies before the
//    __syncthreads after its wait, reads NaN too). Both addresses must be 16-byte aligned, the destination in the
//    block's shared memory and the source outside it (as ldmatrix's rows must be in it).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda_runtime.h"

inline float emu_bf16_lo(uint32_t r) { return std::bit_cast<float>(r << 16); }
inline float emu_bf16_hi(uint32_t r) { return std::bit_cast<float>(r & 0xffff0000u); }

// One warp-collective exchange: deposit() writes this lane's part to emu_warp, then, once all 32 lanes have (and
// are at the same call), collect() reads what it needs; nobody deposits again before all have collected.
template <class Deposit, class Collect>
void emu_warp_exchange(const char* what, Deposit deposit, Collect collect) {
  const unsigned lane = emu_lane;
  const uint64_t g = emu_next_warp_call();
  deposit();
  emu_warp->gen[lane] = g;
  emu_warp->bar.arrive_and_wait();
  for (int i = 0; i < 32; ++i) {
    if (emu_warp->gen[i] != g) {
      std::fprintf(stderr, "EMU: %s with diverged/inactive lanes\n", what);
      std::abort();
    }
  }
  collect();
  emu_warp->bar.arrive_and_wait();
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d = a b + d.
inline void emu_mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int g = static_cast<int>(emu_lane / 4), t = static_cast<int>(emu_lane % 4);
  float* A = emu_warp->wa;  // 16 x 16, row-major
  float* B = emu_warp->wb;  // 16 (k) x 8 (n), row-major
  float* C = emu_warp->wc;  // 16 x 8, row-major
  float out[4];
  emu_warp_exchange(
      "mma.sync",
      [&] {
        for (int r = 0; r < 4; ++r) {
          const int row = g + 8 * (r % 2), k = 2 * t + 8 * (r / 2);
          A[row * 16 + k] = emu_bf16_lo(a[r]);
          A[row * 16 + k + 1] = emu_bf16_hi(a[r]);
        }
        const uint32_t b[2] = {b0, b1};
        for (int r = 0; r < 2; ++r) {
          const int k = 2 * t + 8 * r;
          B[k * 8 + g] = emu_bf16_lo(b[r]);
          B[(k + 1) * 8 + g] = emu_bf16_hi(b[r]);
        }
        for (int r = 0; r < 4; ++r) C[(g + 8 * (r / 2)) * 8 + 2 * t + r % 2] = d[r];
      },
      [&] {
        for (int r = 0; r < 4; ++r) {
          const int row = g + 8 * (r / 2), col = 2 * t + r % 2;
          double acc = C[row * 8 + col];
          for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[row * 16 + k]) * B[k * 8 + col];
          out[r] = static_cast<float>(acc);
        }
      });
  for (int r = 0; r < 4; ++r) d[r] = out[r];
}

// ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16 {r}, [row].
inline void emu_ldmatrix(uint32_t* r, int count, bool trans, const void* row) {
  const unsigned lane = emu_lane, g = lane / 4, t = lane % 4;
  if (lane < 8u * static_cast<unsigned>(count)) {
    if (reinterpret_cast<uintptr_t>(row) % 16 != 0) emu_fail("ldmatrix row address not 16-byte aligned");
    if (!emu_in_shared(row, 16)) emu_fail("ldmatrix row address not in the block's shared memory");
  }
  emu_warp_exchange(
      "ldmatrix", [&] { emu_warp->ptr[lane] = row; },
      [&] {
        for (int i = 0; i < count; ++i) {
          uint16_t e[2];
          for (int j = 0; j < 2; ++j) {
            const auto* p = static_cast<const uint16_t*>(emu_warp->ptr[8 * i + (trans ? 2 * t + j : g)]);
            e[j] = p[trans ? g : 2 * t + j];
          }
          r[i] = static_cast<uint32_t>(e[0]) | static_cast<uint32_t>(e[1]) << 16;
        }
      });
}

// This CUDA thread's cp.async state (per block, by linear thread index).
inline EmuAsyncCopies& emu_async_copies() {
  EmuTsanIgnore ignore;
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  return emu_block->async_copies[tid];
}
inline void emu_cp_async_16(void* dst, const void* src, uint32_t src_bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) {
    emu_fail("cp.async address not 16-byte aligned");
  }
  if (src_bytes != 0 && src_bytes != 16) emu_fail("cp.async src size other than 0 or 16");
  if (!emu_in_shared(dst, 16)) emu_fail("cp.async destination not in the block's shared memory");
  if (emu_in_shared(src, 16)) emu_fail("cp.async source in shared memory (it must be global)");
  std::memset(dst, 0xff, 16);  // NaN (fp32 and bf16) until the wait: a reader of the previous tile sees it
  EmuAsyncCopies& c = emu_async_copies();
  EmuTsanIgnore ignore;
  c.open.push_back({dst, src, 16u, src_bytes});
}
inline void emu_cp_async_commit() {
  EmuAsyncCopies& c = emu_async_copies();
  EmuTsanIgnore ignore;
  c.groups.push_back(std::move(c.open));
  c.open.clear();
}
inline void emu_cp_async_wait(int n) {
  EmuAsyncCopies& c = emu_async_copies();
  for (;;) {
    std::vector<EmuAsyncCopy> group;
    {
      EmuTsanIgnore ignore;
      if (static_cast<int>(c.groups.size()) <= n) return;
      group = std::move(c.groups.front());
      c.groups.pop_front();
    }
    for (const EmuAsyncCopy& x : group) {  // this thread's accesses, as TSan should see them
      std::memcpy(x.dst, x.src, x.src_bytes);
      std::memset(static_cast<unsigned char*>(x.dst) + x.src_bytes, 0, x.bytes - x.src_bytes);
    }
  }
}

// mbarrier, named barriers and setmaxnreg (kernels/cuda/mbarrier_ptx.cuh). An mbarrier lives in 8 bytes of the
// block's shared memory (8-byte aligned); its state is kept in EmuBlock::mbarriers by address, and init writes a
// magic value there that every later use checks (data stored over a barrier fails). A phase completes at its
// `count`-th arrival; a wait for parity p returns once the phase of that parity has completed (the current phase's
// parity differs from p), else the fiber waits (so a wait no arrival will ever end is the emulator's deadlock).
// cp.async.mbarrier.arrive.noinc hands all of the thread's cp.async copies not yet waited for to the barrier, as one
// of its arrivals: they land (source read, destination written) only when the phase completes, so a consumer reading
// a stage before its wait reads NaN, and a producer refilling a stage before the consumers released it writes NaN
// under the products still reading it (wgmma's retirement check). Named barriers (bar.sync, bar.arrive: ids 1..15,
// thread counts a multiple of 32, the same count within a phase) count threads; both are warp-uniform (aligned).
// setmaxnreg checks its count (24..256, a multiple of 8) and that the warp is converged; registers are not modelled.
// An arrival that does not wait yields (emu_yield), so a block run last to first lets the threads it released run
// before the arriving one issues more: a consumer missing its wait for a stage reads it before it landed.
inline EmuWgmmaState& emu_wgmma_state();  // below, with wgmma
inline constexpr uint64_t kEmuMbarrierMagic = 0x6d62617272696572ull;  // "mbarrier"
inline EmuMbarrier& emu_mbarrier(const void* p, const char* what) {
  EmuTsanIgnore ignore;
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0 || !emu_in_shared(p, 8)) {
    std::fprintf(stderr, "EMU: %s: not an 8-byte aligned address in the block's shared memory\n", what);
    std::abort();
  }
  const auto it = emu_block->mbarriers.find(p);
  if (it == emu_block->mbarriers.end()) {
    std::fprintf(stderr, "EMU: %s on an mbarrier never initialised\n", what);
    std::abort();
  }
  uint64_t now;
  std::memcpy(&now, p, 8);
  if (now != it->second.magic) {
    std::fprintf(stderr, "EMU: %s: the mbarrier's shared memory was overwritten since its init\n", what);
    std::abort();
  }
  return it->second;
}
inline void emu_mbarrier_init(void* p, unsigned count) {
  if (count == 0 || count >= (1u << 20)) emu_fail("mbarrier.init: count outside 1 .. 2^20 - 1");
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0 || !emu_in_shared(p, 8)) {
    emu_fail("mbarrier.init: not an 8-byte aligned address in the block's shared memory");
  }
  EmuTsanIgnore ignore;
  EmuMbarrier& mb = emu_block->mbarriers[p];
  if (!mb.landing.empty()) emu_fail("mbarrier.init on a barrier whose phase still tracks cp.async copies");
  mb.expected = mb.pending = count;
  mb.phase = 0;
  mb.magic = kEmuMbarrierMagic ^ reinterpret_cast<uintptr_t>(p);
  std::memcpy(p, &mb.magic, 8);
}
// One arrival (the caller holds no TSan ignore); the last of a phase lands its copies and completes it.
inline void emu_mbarrier_arrive_on(EmuMbarrier& mb) {
  char* sync;
  {
    EmuTsanIgnore ignore;
    sync = &mb.sync[mb.phase & 1];  // the phase this arrival counts toward
  }
  emu_tsan_release(sync);
  std::vector<EmuAsyncCopy> land;
  {
    EmuTsanIgnore ignore;
    if (--mb.pending != 0) return;
    land = std::move(mb.landing);
    mb.landing.clear();
  }
  for (const EmuAsyncCopy& x : land) {
    std::memcpy(x.dst, x.src, x.src_bytes);
    std::memset(static_cast<unsigned char*>(x.dst) + x.src_bytes, 0, x.bytes - x.src_bytes);
  }
  emu_tsan_release(sync);
  EmuTsanIgnore ignore;
  mb.pending = mb.expected;
  ++mb.phase;
  emu_fiber_woke();
}
// After an arrival that does not wait: the first thread in the scheduler's order that can run goes next (a consumer
// the arrival released, where the block runs last to first, before the producer issues more).
inline void emu_yield() {
  const EmuThreadRegs regs = EmuThreadRegs::save();
  emu_fiber_yield();
  EmuTsanIgnore ignore;
  regs.restore();
}
inline void emu_mbarrier_arrive(void* p) {
  emu_mbarrier_arrive_on(emu_mbarrier(p, "mbarrier.arrive"));
  emu_yield();
}
inline void emu_mbarrier_wait(void* p, unsigned parity) {
  EmuMbarrier& mb = emu_mbarrier(p, "mbarrier.try_wait.parity");
  if (parity > 1) emu_fail("mbarrier.try_wait.parity: parity other than 0 or 1");
  {
    EmuTsanIgnore ignore;
    while ((mb.phase & 1) == parity) {
      const EmuThreadRegs regs = EmuThreadRegs::save();
      emu_fiber_wait(&mb.phase, mb.phase);
      regs.restore();
    }
  }
  emu_tsan_acquire(&mb.sync[parity]);  // the phase of that parity, now completed
}
inline void emu_cp_async_mbarrier_arrive_noinc(void* p) {
  EmuMbarrier& mb = emu_mbarrier(p, "cp.async.mbarrier.arrive.noinc");
  EmuAsyncCopies& c = emu_async_copies();
  {
    EmuTsanIgnore ignore;
    // On a GPU committed copies stay in their groups too (a cp.async.wait_group still waits for them); the emulator
    // hands them to the barrier alone, so it refuses the mix rather than let such a wait pass early.
    if (!c.groups.empty()) {
      emu_fail("cp.async.mbarrier.arrive.noinc with committed cp.async groups outstanding (not modelled: commit none, "
               "or wait for them first)");
    }
    mb.landing.insert(mb.landing.end(), c.open.begin(), c.open.end());
    c.open.clear();
  }
  emu_mbarrier_arrive_on(mb);
  emu_yield();
}
inline void emu_named_barrier(unsigned id, unsigned count, bool wait) {
  if (id < 1 || id > 15) emu_fail("bar.sync/bar.arrive: id outside 1..15 (0 is __syncthreads')");
  if (count == 0 || count % 32 != 0 || count > blockDim.x * blockDim.y * blockDim.z) {
    emu_fail("bar.sync/bar.arrive: thread count not a positive multiple of 32 within the block");
  }
  emu_warp_converge(wait ? "bar.sync" : "bar.arrive");
  EmuNamedBarrier& b = emu_block->named[id];
  uint64_t gen;
  {
    EmuTsanIgnore ignore;
    gen = b.gen;
    if (b.arrived == 0) {
      b.expected = count;
    } else if (b.expected != count) {
      emu_fail("bar.sync/bar.arrive: thread counts differ within one phase of a named barrier");
    }
  }
  emu_tsan_release(&b.sync[gen & 1]);
  {
    EmuTsanIgnore ignore;
    if (++b.arrived == b.expected) {
      b.arrived = 0;
      ++b.gen;
      emu_fiber_woke();
    } else if (wait) {
      const EmuThreadRegs regs = EmuThreadRegs::save();
      emu_fiber_wait(&b.gen, gen);
      regs.restore();
    }
  }
  if (wait) {
    emu_tsan_acquire(&b.sync[gen & 1]);
  } else {
    emu_yield();
  }
}
// setmaxnreg is the warpgroup's: recorded in the thread's wgmma trace, which the block's end compares across each
// warpgroup (a warp that returned before it, or took another count, fails there).
inline void emu_setmaxnreg(int count) {
  if (count < 24 || count > 256 || count % 8 != 0) emu_fail("setmaxnreg: count outside 24..256 or not a multiple of 8");
  emu_warp_converge("setmaxnreg");
  EmuWgmmaState& st = emu_wgmma_state();
  EmuTsanIgnore ignore;
  st.trace.push_back({3, count, 0, 0, 0});
}

// wgmma (kernels/cuda/wgmma_ptx.cuh), sm_90a. Shared-window addresses are offsets in the block's dynamic shared
// memory (smem_u32). A descriptor is decoded as the hardware reads it: 14-bit start address, LBO and SBO in 16-byte
// units, base offset (must be 0) and swizzle mode (must be 1: 128 bytes); element addresses get the 128-byte
// swizzle (bits 4-6 XOR bits 7-9), so a tile stored in another layout, or a descriptor with the wrong start or
// stride, reads the wrong elements here as on a GPU. MN-major operands require LBO == SBO (the only form
// wgmma_ptx.cuh writes; which field is the k-group stride then does not matter). Each lane computes its own N / 2
// outputs, in double, rounded once, from its warp's 16 rows of A (from shared memory, or from the warp's registers
// by an exchange) and shared memory as it is at the call. The asynchrony: the accumulators read NaN from the call
// until the wgmma_wait that retires the product's commit group, which writes the results (a later product of the
// same batch on the same accumulators chains on the pending values, as the hardware does); so a missing commit or
// wait, or a read of the accumulators before it, gives NaN. The retirement computes each product again from its
// operands as they are then and fails if the result differs (A registers or shared memory written while it was in
// flight: a refill before the wait, a P packed into the array a product still reads) or if the accumulators no
// longer hold the NaN (written in flight). Each warp computes its own rows; the warpgroup as a whole is checked when
// the block ends (cuda_runtime.h's emu_wgmma_check_block: its 128 threads issued the same wgmma instructions with
// the same operands, and retired every product). The proxy fence: wgmma reads shared memory through the async
// proxy, which sees generic-proxy writes (stores, cp.async copies as they land) only past a fence_proxy_async; the
// emulator keeps a copy of the dynamic shared memory taken at each fence (any thread's: it does not track which
// thread wrote what, so only a fence missing from every writer and reader, or one placed before the writes, shows)
// and fails a product that, at its issue, reads an element that differs from that copy.
inline uint32_t emu_smem_offset(const void* p) {
  const auto* c = static_cast<const unsigned char*>(p);
  const auto* dyn = reinterpret_cast<const unsigned char*>(emu_smem);
  if (c < dyn || c >= dyn + emu_block->dynamic_bytes) {
    emu_fail("smem_u32: not an address in the block's dynamic shared memory");
  }
  return static_cast<uint32_t>(c - dyn);
}
inline EmuWgmmaState& emu_wgmma_state() {
  EmuTsanIgnore ignore;
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  return emu_block->wgmma[tid];
}
inline void emu_wgmma_commit() {
  emu_warp_converge("wgmma.commit_group");
  EmuWgmmaState& st = emu_wgmma_state();
  EmuTsanIgnore ignore;
  st.trace.push_back({1, 0, 0, 0, 0});
  st.groups.push_back(std::move(st.open));
  st.open.clear();
}
struct EmuSw128Desc {
  uint32_t start, lbo, sbo;
};
inline EmuSw128Desc emu_sw128_decode(uint64_t d) {
  if ((d >> 62) != 1) emu_fail("wgmma descriptor: swizzle mode other than 128 bytes");
  if (((d >> 49) & 7) != 0) emu_fail("wgmma descriptor: nonzero base offset");
  return {static_cast<uint32_t>(d & 0x3FFF) << 4, static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4,
          static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4};
}
inline void emu_fence_proxy_async() {
  EmuTsanIgnore ignore;  // the whole block's shared memory, which its other threads write (in order, as fibers)
  std::memcpy(emu_block->async_view.data(), emu_smem, emu_block->dynamic_bytes);
}
// at_issue: also checked against the async proxy's copy.
inline float emu_sw128_load(uint32_t addr, bool at_issue) {
  addr ^= ((addr >> 7) & 7) << 4;
  const auto* base = reinterpret_cast<const unsigned char*>(emu_smem);
  if (addr + 2 > emu_block->dynamic_bytes) emu_fail("wgmma operand outside the block's dynamic shared memory");
  uint16_t bits;
  std::memcpy(&bits, base + addr, 2);
  if (at_issue) {
    EmuTsanIgnore ignore;
    if (std::memcmp(emu_block->async_view.data() + addr, &bits, 2) != 0) {
      emu_fail("wgmma reads shared memory written (a store, or a cp.async that landed) after the last "
               "fence_proxy_async: the async proxy may not see it");
    }
  }
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}
// K-major operand element (row, k) (row < 128, k < 16) and MN-major B element (k, n) (k < 16, n < 64).
inline float emu_kmajor(const EmuSw128Desc& d, int row, int k, bool at_issue) {
  return emu_sw128_load(d.start + (row / 8) * d.sbo + (row % 8) * 128 + 2 * k, at_issue);
}
inline float emu_mnmajor(const EmuSw128Desc& d, int k, int n, bool at_issue) {
  if (d.lbo != d.sbo) emu_fail("wgmma MN-major descriptor with LBO != SBO (not a layout wgmma_ptx.cuh writes)");
  return emu_sw128_load(d.start + (k / 8) * d.sbo + (k % 8) * 128 + 2 * n, at_issue);
}
// One product m64nNk16 .f32.bf16.bf16 (N = 32, 64 or 128; MN-major B at N <= 64) for this lane: out[i] =
// (accumulate ? in[i] : 0) + (A B)[its element i]; A from registers `a` (its layout in wgmma_ptx.cuh; a warp exchange) or, when a is null, from desc_a
// (K-major, or MN-major with a_mn: the transpose flag); B from desc_b, K-major or (b_mn) MN-major. at_issue: the
// shared-memory operands also checked against the async proxy's view (emu_sw128_load).
inline void emu_wgmma_product(float* out, int N, const uint32_t* a, uint64_t desc_a, bool a_mn, uint64_t desc_b,
                              bool b_mn, const float* in, bool accumulate, bool at_issue) {
  const int lane = static_cast<int>(emu_lane), g = lane / 4, t = lane % 4;
  const int w = static_cast<int>(threadIdx.x / 32 % 4);
  float A[16][16];
  if (a != nullptr) {
    float* wa = emu_warp->wa;
    emu_warp_exchange(
        "wgmma (A from registers)",
        [&] {
          for (int r = 0; r < 4; ++r) {
            const int row = g + 8 * (r % 2), k = 2 * t + 8 * (r / 2);
            wa[row * 16 + k] = emu_bf16_lo(a[r]);
            wa[row * 16 + k + 1] = emu_bf16_hi(a[r]);
          }
        },
        [&] { std::memcpy(A, wa, sizeof A); });
  } else {
    emu_warp_converge("wgmma");
    const EmuSw128Desc da = emu_sw128_decode(desc_a);
    for (int r = 0; r < 16; ++r)
      for (int k = 0; k < 16; ++k) A[r][k] = a_mn ? emu_mnmajor(da, k, 16 * w + r, at_issue) : emu_kmajor(da, 16 * w + r, k, at_issue);
  }
  const EmuSw128Desc db = emu_sw128_decode(desc_b);
  for (int i = 0; i < N / 2; ++i) {
    const int r = g + 8 * ((i / 2) % 2), n = 8 * (i / 4) + 2 * t + i % 2;
    double acc = accumulate ? in[i] : 0.0;
    for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[r][k]) * (b_mn ? emu_mnmajor(db, k, n, at_issue) : emu_kmajor(db, n, k, at_issue));
    out[i] = static_cast<float>(acc);
  }
}
// wgmma.mma_async m64nNk16: the product (emu_wgmma_product) pending in this thread's open batch, d NaN until retired.
inline void emu_wgmma_m64nNk16(float* d, int N, const uint32_t* a, uint64_t desc_a, bool a_mn, uint64_t desc_b,
                               bool b_mn, bool accumulate) {
  if (blockDim.x % 128 != 0 || blockDim.y != 1 || blockDim.z != 1) emu_fail("wgmma in a block not of whole warpgroups");
  if ((N != 32 && N != 64 && N != 128) || (N == 128 && b_mn)) emu_fail("wgmma: an N (or an MN-major B's N) not emulated");
  // The accumulators' input: this batch's pending result for d if there is one (chained products), else d itself.
  EmuWgmmaState& st = emu_wgmma_state();
  {
    EmuTsanIgnore ignore;
    st.trace.push_back({0, N, (a != nullptr) | a_mn << 1 | b_mn << 2 | accumulate << 3, a != nullptr ? 0 : desc_a, desc_b});
  }
  EmuWgmmaResult res{d, N / 2, {}, a, desc_a, desc_b, a_mn, b_mn, accumulate, {}};
  {
    const float* in = d;
    EmuTsanIgnore ignore;
    for (auto it = st.open.rbegin(); it != st.open.rend(); ++it) {
      if (it->d == d) {
        in = it->v;
        break;
      }
    }
    std::memcpy(res.in, in, sizeof(float) * res.n);
  }
  emu_wgmma_product(res.v, N, a, desc_a, a_mn, desc_b, b_mn, res.in, accumulate, true);
  for (int i = 0; i < N / 2; ++i) d[i] = NAN;  // until the wait that retires it
  EmuTsanIgnore ignore;
  st.open.push_back(res);
}
inline void emu_wgmma_wait(int n) {
  emu_warp_converge("wgmma.wait_group");
  EmuWgmmaState& st = emu_wgmma_state();
  {
    EmuTsanIgnore ignore;
    st.trace.push_back({2, n, 0, 0, 0});
  }
  for (;;) {
    std::vector<EmuWgmmaResult> group;
    {
      EmuTsanIgnore ignore;
      if (static_cast<int>(st.groups.size()) <= n) return;
      group = std::move(st.groups.front());
      st.groups.pop_front();
    }
    for (const EmuWgmmaResult& r : group) {  // before any result of the group lands (chained products share d)
      for (int i = 0; i < r.n; ++i) {
        if (!std::isnan(r.d[i])) emu_fail("wgmma accumulators written while the product was in flight");
      }
    }
    for (const EmuWgmmaResult& r : group) {  // every lane retires the same products in the same order
      float again[64];
      emu_wgmma_product(again, 2 * r.n, r.a, r.desc_a, r.a_mn, r.desc_b, r.b_mn, r.in, r.accumulate, false);
      if (std::memcmp(again, r.v, sizeof(float) * r.n) != 0) {
        emu_fail("wgmma operands changed while it was in flight (A registers or shared memory written before the "
                 "wgmma.wait_group that retires it)");
      }
    }
    for (const EmuWgmmaResult& r : group) std::memcpy(r.d, r.v, sizeof(float) * r.n);
  }
}
