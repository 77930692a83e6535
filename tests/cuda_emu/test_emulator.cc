// The emulator itself (shim/cuda_runtime.h, fiber.cc): a block's threads meet at its barriers with their own
// threadIdx, a missing __syncthreads shows (in both scheduling orders), and a barrier that no thread can pass
// or a shuffle with lanes missing aborts with a message instead of hanging. The kernel tests rely on all of it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "emu_ptx.h"
#include "kernels/cuda/common.cuh"  // the converted one: its vector loads and stores
#include "run_aborting.h"

namespace {

using gpt::emu_test::run_aborting;

// Each thread writes its linear index into shared memory, meets the others, and reads its mirror thread's value;
// then records its own threadIdx and blockIdx, read after a second barrier (they must survive the switches).
void mirror_kernel(int* mirror, int* index) {
  const unsigned n = blockDim.x * blockDim.y * blockDim.z;
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  int* s = reinterpret_cast<int*>(emu_smem);
  s[t] = static_cast<int>(t + 1000 * blockIdx.x);
  __syncthreads();
  const int m = s[n - 1 - t];
  __syncthreads();
  const unsigned b = blockIdx.x + gridDim.x * blockIdx.y;
  mirror[b * n + t] = m;
  index[b * n + t] = static_cast<int>(threadIdx.x + 100 * threadIdx.y + 10000 * threadIdx.z + 1000000 * b);
}

// Without the barrier it needs: reads the next thread's slot of shared memory, which may not be written yet.
void racy_kernel(float* out) {
  const unsigned t = threadIdx.x;
  emu_smem[t] = static_cast<float>(t);
  out[blockIdx.x * blockDim.x + t] = emu_smem[(t + 1) % blockDim.x];
}

// Half of a warp at a warp barrier, the other half at the block's: no thread can go on.
void deadlock_kernel() {
  if (threadIdx.x < 16)
    __syncwarp();
  else
    __syncthreads();
}

void divergent_shuffle_kernel(float* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 16);
}

// One wgmma m64n64k16 (A and B from a 128-byte-swizzled tile at the start of the dynamic shared memory), its commit
// and (unless left_in_flight) its wait, in every warpgroup but skip_wg, by every warp but skip_warp; warp return_warp
// returns first.
void wgmma_kernel(int skip_warp, int skip_wg, int left_in_flight, int return_warp) {
  const uint64_t desc = uint64_t{1} << 62 | uint64_t{1024 / 16} << 32 | uint64_t{16 / 16} << 16;
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (warp / 4 == skip_wg || warp == return_warp) return;
  float d[32] = {};
  if (warp != skip_warp) emu_wgmma_m64nNk16(d, 64, nullptr, desc, false, desc, false, false);
  emu_wgmma_commit();
  if (!left_in_flight) emu_wgmma_wait(0);
}
// The block's 128 threads write the 64 x 64 bf16 tile (ones) that wgmma_kernel's product reads, meet at
// __syncthreads, and take that product; fence: 0 none, 1 fence_proxy_async after the writes (as a kernel must),
// 2 before them.
void fenced_wgmma_kernel(int fence, float* out) {
  if (fence == 2) emu_fence_proxy_async();
  auto* tile = reinterpret_cast<uint16_t*>(emu_smem);
  for (int i = 0; i < 32; ++i) tile[32 * threadIdx.x + i] = 0x3f80;  // bf16 1.0
  if (fence == 1) emu_fence_proxy_async();
  __syncthreads();
  const uint64_t desc = uint64_t{1} << 62 | uint64_t{1024 / 16} << 32 | uint64_t{16 / 16} << 16;
  float d[32] = {};
  emu_wgmma_m64nNk16(d, 64, nullptr, desc, false, desc, false, false);
  emu_wgmma_commit();
  emu_wgmma_wait(0);
  out[threadIdx.x] = d[0];
}
// 128 bytes of static shared memory (as convert.py turns a `__shared__ float s[32]` into one).
void static_smem_kernel() { static_cast<float*>(emu_shared_alloc(128))[threadIdx.x] = 1.0f; }
// A kernel as convert.py writes one declared with __launch_bounds__(64).
void bounded_kernel(int* out) {
  emu_check_launch_bounds(64);
  out[threadIdx.y * blockDim.x + threadIdx.x] = 1;
}

// A two-stage pipeline over `tiles` tiles of 128 floats (kernels/cuda/mbarrier_ptx.cuh's protocol): warp 0 copies
// tile t into stage t % 2 by cp.async (16 bytes per lane) and arrives on full[t % 2] when they land; warp 1 waits
// for it, copies the stage out (each lane its neighbour's 16 bytes), and releases the stage (empty, one arrival per
// warp) for the producer's tile t + 2. Faults: 1, the consumer skips the wait for full; 2, the producer skips the
// wait for empty; 3, a consumer stores into the barrier's bytes; 4, the producer's lane 31 never arrives; 5, the
// consumer skips the wait for full at tile 1 alone; 6, lane 31 never arrives and the consumer waits for nothing.
enum PipeFault {
  kPipeOk,
  kPipeNoFullWait,
  kPipeNoEmptyWait,
  kPipeOverwrite,
  kPipeMissingArrival,
  kPipeNoWaitAt1,
  kPipeMissingArrivalNoWait
};
void pipeline_kernel(const float* src, float* out, int tiles, int fault) {
  auto* bars = reinterpret_cast<uint64_t*>(emu_smem);  // full[2], empty[2]
  float* stage = emu_smem + 8;                         // 2 x 128 floats, 16-byte aligned
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) emu_mbarrier_init(&bars[s], 32), emu_mbarrier_init(&bars[2 + s], 1);
  }
  __syncthreads();
  for (int t = 0; t < tiles; ++t) {
    const int s = t % 2;
    if (warp == 0) {
      if (t >= 2 && fault != kPipeNoEmptyWait) emu_mbarrier_wait(&bars[2 + s], (t / 2 - 1) & 1);
      emu_cp_async_16(stage + 128 * s + 4 * lane, src + 128 * t + 4 * lane, 16);
      if ((fault != kPipeMissingArrival && fault != kPipeMissingArrivalNoWait) || lane != 31) {
        emu_cp_async_mbarrier_arrive_noinc(&bars[s]);
      }
    } else {
      const bool skip =
          fault == kPipeNoFullWait || fault == kPipeMissingArrivalNoWait || (fault == kPipeNoWaitAt1 && t == 1);
      if (!skip) emu_mbarrier_wait(&bars[s], (t / 2) & 1);
      float* mine = out + 128 * tiles * blockIdx.x;  // each block its own copy
      for (int j = 0; j < 4; ++j) mine[128 * t + 4 * (lane ^ 1) + j] = stage[128 * s + 4 * (lane ^ 1) + j];
      if (fault == kPipeOverwrite && t == 1) reinterpret_cast<float*>(&bars[s])[0] = 0.0f;  // full[s]'s low half
      __syncwarp();
      if (lane == 0) emu_mbarrier_arrive(&bars[2 + s]);
    }
  }
}
// Warps 0 and 2 meet at named barrier 3 (64 threads; warp 1 is not part of it, and waits for no one): warp 2 writes
// a row of shared memory, arrives (bar.arrive: no wait), and warp 0 reads the row after its bar.sync; with_barrier 0:
// without it. count: warp 0's thread count (not 64: a phase of differing counts).
void named_barrier_kernel(float* out, int with_barrier, int count) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (warp == 2) {
    emu_smem[lane] = static_cast<float>(lane + 1);
    if (with_barrier) emu_named_barrier(3, 64, false);
  } else if (warp == 0) {
    if (with_barrier) emu_named_barrier(3, static_cast<unsigned>(count), true);
    out[lane] = emu_smem[lane];
  }
}

// setmaxnreg in a block of two warpgroups: every warp of each takes the warpgroup's count, but `early` (a warp
// index) returns before it, or (with `other`) warp 5 takes another count.
void setmaxnreg_kernel(int early, int other) {
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (warp == early) return;
  emu_setmaxnreg(warp < 4 ? 40 : (other && warp == 5 ? 232 : 240));
}

}  // namespace

TEST_CASE("cuda_emu: a block's threads meet at __syncthreads, each keeping its own threadIdx", "[cuda_emu][emulator]") {
  for (const dim3 block : {dim3(1024), dim3(8, 4, 3), dim3(33)}) {
    const unsigned n = block.x * block.y * block.z;
    const dim3 grid(3, 2);
    std::vector<int> mirror(6 * n, -1), index(6 * n, -1);
    emulate_launch(mirror_kernel, grid, block, n * sizeof(int), nullptr, mirror.data(), index.data());
    for (unsigned b = 0; b < 6; ++b)
      for (unsigned t = 0; t < n; ++t) {
        CAPTURE(block.x, block.y, block.z, b, t);
        REQUIRE(mirror[b * n + t] == static_cast<int>(n - 1 - t + 1000 * (b % 3)));
        const unsigned x = t % block.x, y = (t / block.x) % block.y, z = t / (block.x * block.y);
        REQUIRE(index[b * n + t] == static_cast<int>(x + 100 * y + 10000 * z + 1000000 * b));
      }
  }
}

TEST_CASE("cuda_emu: a missing __syncthreads reads unwritten shared memory, whichever way round",
          "[cuda_emu][emulator][race]") {
  // Even blocks run their threads first to last, odd ones last to first, each until it waits: in one order
  // every thread but the last reads a slot not yet written (NaN-filled), in the other only the last (thread 0's
  // slot). A hazard shows from whichever side it is, also with EMU_CONC (blocks side by side).
  const unsigned n = 64;
  std::vector<float> out(2 * n, 0.0f);
  emulate_launch(racy_kernel, dim3(2), dim3(n), n * sizeof(float), nullptr, out.data());
  std::vector<int> nan(2, 0);
  for (unsigned b = 0; b < 2; ++b)
    for (unsigned t = 0; t < n; ++t) nan[b] += std::isnan(out[b * n + t]);
  CHECK(nan == std::vector<int>{n - 1, 1});
}

TEST_CASE("cuda_emu: a barrier no thread can pass, or a shuffle with lanes missing, aborts", "[cuda_emu][emulator]") {
  const auto [deadlock, deadlock_aborted] =
      run_aborting([] { emulate_launch(deadlock_kernel, dim3(1), dim3(32), 0, nullptr); });
  CHECK(deadlock_aborted);
  CHECK(deadlock.find("EMU: deadlock") != std::string::npos);
  float out[16];
  const auto [shuffle, shuffle_aborted] =
      run_aborting([&out] { emulate_launch(divergent_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out); });
  CHECK(shuffle_aborted);
  CHECK(shuffle.find("EMU: shuffle from an inactive/out-of-step lane") != std::string::npos);
}

TEST_CASE("cuda_emu: a launch of more threads per block than the kernel's __launch_bounds__ aborts",
          "[cuda_emu][emulator]") {
  std::vector<int> out(128, 0);
  emulate_launch(bounded_kernel, dim3(1), dim3(32, 2), 0, nullptr, out.data());  // 64: at the bound
  CHECK(std::count(out.begin(), out.end(), 1) == 64);
  const auto [over, aborted] =
      run_aborting([&out] { emulate_launch(bounded_kernel, dim3(1), dim3(32, 3), 0, nullptr, out.data()); });
  CHECK(aborted);
  CHECK(over.find("EMU: launch of 96 threads per block, over the kernel's __launch_bounds__ of 64") !=
        std::string::npos);
}

TEST_CASE("cuda_emu: a warpgroup's threads issue the same wgmma instructions, and retire each before they exit",
          "[cuda_emu][emulator]") {
  emulate_launch(wgmma_kernel, dim3(2), dim3(128), 8192, nullptr, -1, -1, 0, -1);  // every warp
  emulate_launch(wgmma_kernel, dim3(1), dim3(256), 8192, nullptr, -1, 1, 0, -1);   // a whole warpgroup skips: allowed
  const auto [skipped, skip_aborted] =
      run_aborting([] { emulate_launch(wgmma_kernel, dim3(1), dim3(256), 8192, nullptr, 5, -1, 0, -1); });
  CHECK(skip_aborted);
  CHECK(skipped.find("EMU: warpgroup 1's threads issued different wgmma instructions: at its instruction 0 thread 128 "
                     "issued mma_async n 64") != std::string::npos);
  CHECK(skipped.find("thread 160 commit_group") != std::string::npos);
  const auto [returned, return_aborted] =  // warp 0 (the warpgroup's first) returns, the others issue
      run_aborting([] { emulate_launch(wgmma_kernel, dim3(1), dim3(128), 8192, nullptr, -1, -1, 0, 0); });
  CHECK(return_aborted);
  CHECK(returned.find("at its instruction 0 thread 0 issued nothing more, thread 32 mma_async") != std::string::npos);
  const auto [later, later_aborted] =  // warp 2 returns
      run_aborting([] { emulate_launch(wgmma_kernel, dim3(1), dim3(128), 8192, nullptr, -1, -1, 0, 2); });
  CHECK(later_aborted);
  CHECK(later.find("thread 0 issued mma_async n 64 flags 0 desc_a") != std::string::npos);
  CHECK(later.find("thread 64 nothing more") != std::string::npos);
  const auto [flight, flight_aborted] =
      run_aborting([] { emulate_launch(wgmma_kernel, dim3(1), dim3(128), 8192, nullptr, -1, -1, 1, -1); });
  CHECK(flight_aborted);
  CHECK(flight.find("wgmma products not retired by a wgmma.wait_group (0 uncommitted, 1 groups in flight)") !=
        std::string::npos);
}

TEST_CASE("cuda_emu: wgmma reads shared memory written by stores only past a fence_proxy_async",
          "[cuda_emu][emulator]") {
  std::vector<float> out(128, 0.0f);
  emulate_launch(fenced_wgmma_kernel, dim3(1), dim3(128), 8192, nullptr, 1, out.data());
  CHECK(out[0] == 16.0f);  // a 16-long dot product of ones
  CHECK(out[127] == 16.0f);
  for (const int fence : {0, 2}) {
    const auto [log, aborted] = run_aborting(
        [&] { emulate_launch(fenced_wgmma_kernel, dim3(1), dim3(128), 8192, nullptr, fence, out.data()); });
    CHECK(aborted);
    CHECK(log.find("wgmma reads shared memory written (a store, or a cp.async that landed) after the last "
                   "fence_proxy_async") != std::string::npos);
  }
}

TEST_CASE("cuda_emu: static and dynamic shared memory together within 48 KB, or the opt-in", "[cuda_emu][emulator]") {
  emulate_launch(static_smem_kernel, dim3(1), dim3(32), 48 * 1024 - 128, nullptr);  // 48 KB in all
  const auto [over, aborted] =
      run_aborting([] { emulate_launch(static_smem_kernel, dim3(1), dim3(32), 48 * 1024, nullptr); });
  CHECK(aborted);
  CHECK(over.find("EMU: 128 bytes of static and 49152 of dynamic shared memory: over the 48 KB") != std::string::npos);
  REQUIRE(cudaFuncSetAttribute(static_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 48 * 1024) == 0);
  emulate_launch(static_smem_kernel, dim3(1), dim3(32), 48 * 1024, nullptr);  // opted in
}

TEST_CASE("cuda_emu: cudaEventElapsedTime needs two recorded, timing, completed events, as on a GPU",
          "[cuda_emu][emulator]") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == 0);
  cudaEvent_t a = nullptr, b = nullptr, untimed = nullptr;
  REQUIRE(cudaEventCreate(&a) == 0);
  REQUIRE(cudaEventCreate(&b) == 0);
  REQUIRE(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming) == 0);
  float ms = -1.0f;
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorInvalidResourceHandle);  // never recorded
  int ran = 0;
  REQUIRE(cudaEventRecord(a, s) == 0);
  emu_enqueue(s, [&ran] { ++ran; });  // deferred: the created stream runs it when something needs it
  REQUIRE(cudaEventRecord(b, s) == 0);
  REQUIRE(cudaEventRecord(untimed, s) == 0);
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorNotReady);
  CHECK(ran == 0);
  REQUIRE(cudaStreamSynchronize(s) == 0);
  CHECK(ran == 1);
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
  CHECK(ms == 0.0f);
  CHECK(cudaEventElapsedTime(&ms, a, untimed) == cudaErrorInvalidResourceHandle);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaEventDestroy(untimed);
  cudaStreamDestroy(s);
}

TEST_CASE("cuda_emu: a vector load or store through a misaligned pointer aborts, as it faults on a GPU",
          "[cuda_emu][emulator]") {
  // The converted kernels' casts to CUDA vector types check the alignment: common.cuh's 8-byte bf16 accesses here.
  alignas(16) gpt::bf16 buf[12] = {};
  for (int i = 0; i < 12; ++i) buf[i] = gpt::f32_to_bf16(static_cast<float>(i));
  float v[4] = {};
  gpt::cuda_emu::load4_bf16(v, buf + 4);  // 8-byte aligned: fine
  CHECK(v[0] == 4.0f);
  CHECK(v[3] == 7.0f);
  const auto [load, load_aborted] = run_aborting([&] { gpt::cuda_emu::load4_bf16(v, buf + 1); });
  CHECK(load_aborted);
  CHECK(load.find("EMU: misaligned vector access (8 bytes") != std::string::npos);
  const float w[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  const auto [store, store_aborted] = run_aborting([&] { gpt::cuda_emu::store4_bf16(buf + 2, w, true, 4); });
  CHECK(store_aborted);
  CHECK(store.find("EMU: misaligned vector access (8 bytes") != std::string::npos);
  gpt::cuda_emu::store4_bf16(buf + 2, w, false, 4);  // the scalar path: any alignment
  CHECK(gpt::bf16_to_f32(buf[5]) == 4.0f);
}

// The pipeline (pipeline_kernel) run over `blocks` blocks of `tiles` tiles of src, each block's copy in out.
struct Pipeline {
  std::vector<float> src = std::vector<float>(128 * 5), out;
  Pipeline() {
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) + 0.5f;
  }
  // Two blocks: the even one runs its warps first to last (the producer ahead), the odd one last to first.
  void launch(int fault, unsigned blocks, int tiles = 5) {
    out.assign(128 * tiles * blocks, -1.0f);
    emulate_launch(pipeline_kernel, dim3(blocks), dim3(64), (8 + 256) * sizeof(float), nullptr, src.data(), out.data(),
                   tiles, fault);
  }
  // NaNs in block b's copy of tiles [t0, t1).
  long nans(unsigned b, int tiles, int t0, int t1) const {
    const auto first = out.begin() + 128 * (tiles * b + t0), last = out.begin() + 128 * (tiles * b + t1);
    return std::count_if(first, last, [](float x) { return std::isnan(x); });
  }
};

TEST_CASE("cuda_emu: mbarriers order a producer warp's cp.async stages and a consumer warp's reads",
          "[cuda_emu][emulator]") {
  Pipeline p;
  p.launch(kPipeOk, 2);
  CHECK(std::equal(p.src.begin(), p.src.end(), p.out.begin()));
  CHECK(std::equal(p.src.begin(), p.src.end(), p.out.begin() + 640));
  // Without the wait for empty the producer fills tile 2 over tile 0 (and tile 4 over it) before the consumer took
  // them: the barriers' phases run ahead of the consumer, which at tile 1 waits for a parity that is current again
  // (stage 1 completed twice). A GPU hangs.
  const auto [refill, refill_aborted] = run_aborting([&] { p.launch(kPipeNoEmptyWait, 1); });
  CHECK(refill_aborted);
  CHECK(refill.find("EMU: deadlock") != std::string::npos);
  const auto [overwrite, overwrite_aborted] = run_aborting([&] { p.launch(kPipeOverwrite, 1); });
  CHECK(overwrite_aborted);
  CHECK(overwrite.find("the mbarrier's shared memory was overwritten since its init") != std::string::npos);
  // One arrival short: the consumer waits for tile 0 forever (a deadlock), its copies never land.
  const auto [missing, missing_aborted] = run_aborting([&] { p.launch(kPipeMissingArrival, 1); });
  CHECK(missing_aborted);
  CHECK(missing.find("EMU: deadlock") != std::string::npos);
}

// The faults that read shared memory without the wait that orders it: races, as TSan builds report them ([race]).
TEST_CASE("cuda_emu: a consumer that skips an mbarrier wait reads its stage before it landed",
          "[cuda_emu][emulator][race]") {
  Pipeline p;
  // Without the wait for full the odd block's consumer, which runs first, reads both stages before they landed: NaN.
  p.launch(kPipeNoFullWait, 2, 2);
  CHECK(p.nans(1, 2, 0, 2) > 0);
  // Skipping only tile 1's wait: in the odd block the consumer waits for tile 0, which the producer's lane 0 (the
  // last to run there) completes; its arrival yields, so the consumer reads tile 1 before lane 0 has issued its copy,
  // and every other lane's copy, issued, has not landed: tile 1's phase is incomplete. All of tile 1 is NaN.
  p.launch(kPipeNoWaitAt1, 2, 2);
  CHECK(p.nans(1, 2, 1, 2) == 128);
  // The same with a consumer that waits for nothing and lane 31 not arriving: the block ends with both stages'
  // phases one arrival short.
  const auto [left, left_aborted] = run_aborting([&] { p.launch(kPipeMissingArrivalNoWait, 1, 2); });
  CHECK(left_aborted);
  CHECK(left.find("block ended with an mbarrier phase incomplete (1 of 32 arrivals missing) and 31 cp.async copies") !=
        std::string::npos);
}

TEST_CASE("cuda_emu: named barriers order the warps that take part, with bar.arrive not waiting",
          "[cuda_emu][emulator]") {
  std::vector<float> out(32, -1.0f);
  emulate_launch(named_barrier_kernel, dim3(1), dim3(96), 32 * sizeof(float), nullptr, out.data(), 1, 64);
  for (int i = 0; i < 32; ++i) CHECK(out[i] == static_cast<float>(i + 1));
  const auto [mixed, mixed_aborted] = run_aborting(
      [&] { emulate_launch(named_barrier_kernel, dim3(1), dim3(96), 32 * sizeof(float), nullptr, out.data(), 1, 96); });
  CHECK(mixed_aborted);
  CHECK(mixed.find("thread counts differ within one phase") != std::string::npos);
}

TEST_CASE("cuda_emu: without its named barrier a warp reads the row another has not written yet",
          "[cuda_emu][emulator][race]") {
  std::vector<float> out(32, -1.0f);
  // Warp 0 runs first (an even block) and reads the row before warp 2 wrote it.
  emulate_launch(named_barrier_kernel, dim3(1), dim3(96), 32 * sizeof(float), nullptr, out.data(), 0, 64);
  CHECK(std::isnan(out[0]));
}

TEST_CASE("cuda_emu: setmaxnreg is every warp of a warpgroup's, with one count", "[cuda_emu][emulator]") {
  emulate_launch(setmaxnreg_kernel, dim3(1), dim3(256), 0, nullptr, -1, 0);
  const auto [early, early_aborted] =
      run_aborting([] { emulate_launch(setmaxnreg_kernel, dim3(1), dim3(256), 0, nullptr, 2, 0); });
  CHECK(early_aborted);
  CHECK(early.find("warpgroup 0's threads issued different wgmma instructions: at its instruction 0 thread 0 issued "
                   "setmaxnreg n 40") != std::string::npos);
  const auto [other, other_aborted] =
      run_aborting([] { emulate_launch(setmaxnreg_kernel, dim3(1), dim3(256), 0, nullptr, -1, 1); });
  CHECK(other_aborted);
  CHECK(other.find("thread 160 setmaxnreg n 232") != std::string::npos);
}
