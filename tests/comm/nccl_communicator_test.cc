// The NCCL Communicator on GPUs, one rank per GPU, bootstrapped over the MPI world: every collective in fp32
// and bf16 against values computed on the host, in-place all-gather, barrier, split, the counters, and
// Work::join's device-side ordering against a compute stream. Needs as many visible GPUs on each node as ranks
// on it; otherwise it prints why it is skipped.
#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/device_select.h"
#include "core/dtype.h"
#include "testing/mpi.h"

namespace gpt {
namespace {

// This rank's GPU (one per rank, by local rank), or -1 after saying why the test is skipped.
int device_or_skip() {
  auto device = device_for_local_rank(testing::g_mpi->local_rank(), testing::g_mpi->local_size(), cuda_device_count());
  if (!device && testing::g_mpi->world_rank() == 0) {
    std::printf("SKIPPED NCCL communicator tests: %s\n", device.status().message().c_str());
  }
  return device ? *device : -1;
}

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(const std::vector<T>& host) : n(host.size()) {
    REQUIRE(cudaMalloc(&ptr, n * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<T> to_host() const {
    std::vector<T> out(n);
    REQUIRE(cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }
};

// The MPI world and an NCCL communicator over it on `device` (destroyed first: the world outlives it).
struct NcclWorld {
  std::unique_ptr<Communicator> world, nccl;
  explicit NcclWorld(int device, void* compute_stream = nullptr) : world(testing::g_mpi->make_world()) {
    auto made = make_nccl_communicator(*world, device, compute_stream);
    INFO(made.status().message());
    REQUIRE(made.has_value());
    nccl = std::move(*made);
  }
};

TEST_CASE("NCCL collectives on GPUs match the host's sums and copies", "[mpi][nccl]") {
  const int device = device_or_skip();
  if (device < 0) return;
  NcclWorld w(device);
  Communicator& nccl = *w.nccl;
  const int r = nccl.rank(), n = nccl.size();
  REQUIRE(n == w.world->size());
  const int64_t k = 1000;  // elements per rank block

  // all_reduce, fp32: rank r contributes (r + 1) * i.
  std::vector<float> mine(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) mine[i] = static_cast<float>((r + 1) * i);
  DeviceBuffer<float> sum(mine);
  nccl.all_reduce(sum.ptr, k, DType::kF32).wait();
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  for (int64_t i = 0; const float x : sum.to_host()) REQUIRE(x == ranks_sum * static_cast<float>(i++));

  // all_reduce, bf16: small integers are exact in bf16.
  std::vector<bf16> lo(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) lo[i] = f32_to_bf16(static_cast<float>(r + i % 7));
  DeviceBuffer<bf16> lo_sum(lo);
  nccl.all_reduce(lo_sum.ptr, k, DType::kBF16).wait();
  for (int64_t i = 0; const bf16 x : lo_sum.to_host()) {
    REQUIRE(bf16_to_f32(x) == static_cast<float>(n * (n - 1) / 2 + n * (i++ % 7)));
  }

  // reduce_scatter: block b of rank r's send is b * 100 + r; rank r receives the sum of block r.
  std::vector<float> send(static_cast<size_t>(k * n));
  for (int b = 0; b < n; ++b) {
    for (int64_t i = 0; i < k; ++i) send[b * k + i] = static_cast<float>(b * 100 + r);
  }
  DeviceBuffer<float> rs_send(send), rs_recv(std::vector<float>(static_cast<size_t>(k), -1.0f));
  nccl.reduce_scatter(rs_send.ptr, rs_recv.ptr, k, DType::kF32).wait();
  for (const float x : rs_recv.to_host()) REQUIRE(x == static_cast<float>(n * r * 100 + n * (n - 1) / 2));

  // all_gather in place: rank r's block holds r.
  std::vector<float> gathered(static_cast<size_t>(k * n), -1.0f);
  for (int64_t i = 0; i < k; ++i) gathered[r * k + i] = static_cast<float>(r);
  DeviceBuffer<float> ag(gathered);
  nccl.all_gather(ag.ptr + r * k, ag.ptr, k, DType::kF32).wait();
  const std::vector<float> got = ag.to_host();
  for (int b = 0; b < n; ++b) REQUIRE(got[b * k + k - 1] == static_cast<float>(b));

  // broadcast from the last rank.
  DeviceBuffer<float> bc(std::vector<float>(static_cast<size_t>(k), static_cast<float>(r)));
  nccl.broadcast(bc.ptr, k, DType::kF32, n - 1).wait();
  for (const float x : bc.to_host()) REQUIRE(x == static_cast<float>(n - 1));
  nccl.barrier().wait();

  const CommStats s = nccl.stats();
  CHECK(s.ops[static_cast<size_t>(CommOp::kAllReduce)].calls == 2);
  CHECK(s.ops[static_cast<size_t>(CommOp::kAllReduce)].bytes == k * 4 + k * 2);
  CHECK(s.ops[static_cast<size_t>(CommOp::kReduceScatter)].elements == k * n);
  CHECK(s.ops[static_cast<size_t>(CommOp::kAllGather)].calls == 1);

  // A split into odd and even ranks sums within each half, ranked by the key.
  auto half = nccl.split(r % 2, r, "half");
  CHECK(half->size() == (n - r % 2 + 1) / 2);
  CHECK(half->rank() == r / 2);
  DeviceBuffer<float> rank_sum(std::vector<float>(1, static_cast<float>(r)));
  half->all_reduce(rank_sum.ptr, 1, DType::kF32).wait();
  float want = 0.0f;
  for (int q = r % 2; q < n; q += 2) want += static_cast<float>(q);
  REQUIRE(rank_sum.to_host()[0] == want);
}

// Two communicators of one GPU (hybrid's shard and replicate groups are two; here a split keeping every rank):
// NCCL's user guide asks that all their collectives run in one order the ranks share, else they may deadlock. The
// second communicator's collective is waited for first; it must still run after the first one (the emulated NCCL
// refuses a collective whose stream is not ordered after the one launched before it).
TEST_CASE("NCCL collectives of two communicators on one GPU run in their launch order", "[mpi][nccl]") {
  const int device = device_or_skip();
  if (device < 0) return;
  NcclWorld w(device);
  Communicator& nccl = *w.nccl;
  auto other = nccl.split(0, nccl.rank(), "other");
  const int n = nccl.size();
  const int64_t k = 1000;
  DeviceBuffer<float> a(std::vector<float>(static_cast<size_t>(k), 1.0f));
  DeviceBuffer<float> b(std::vector<float>(static_cast<size_t>(k), 2.0f));
  for (int round = 0; round < 3; ++round) {
    Work first = nccl.all_reduce(a.ptr, k, DType::kF32);
    Work second = other->all_reduce(b.ptr, k, DType::kF32);
    second.wait();
    first.wait();
  }
  const float n3 = static_cast<float>(n * n * n);
  for (const float x : a.to_host()) REQUIRE(x == n3);
  for (const float x : b.to_host()) REQUIRE(x == 2.0f * n3);
}

// Every rank on GPU 0 (CUDA_VISIBLE_DEVICES set alike for all): NCCL would fail in init with "invalid usage"; the
// set-up says which ranks and which GPU, on every rank, before ncclCommInitRank.
TEST_CASE("NCCL set-up refuses two ranks on one GPU, naming them, on every rank", "[mpi][nccl]") {
  if (device_or_skip() < 0) return;
  auto world = testing::g_mpi->make_world();
  auto made = make_nccl_communicator(*world, 0, nullptr, "world");
  if (world->size() == 1) {  // one rank: GPU 0 is its own
    INFO(made.status().message());
    REQUIRE(made.has_value());
    return;
  }
  REQUIRE_FALSE(made.has_value());
  INFO(made.status().message());
  CHECK(made.status().message().find("ranks 0 and 1 of 'world' would share one GPU") != std::string::npos);
  CHECK(made.status().message().find("one rank per GPU") != std::string::npos);
}

TEST_CASE("NCCL collectives are ordered against the compute stream both ways without a host wait", "[mpi][nccl]") {
  const int device = device_or_skip();
  if (device < 0) return;
  REQUIRE(cudaSetDevice(device) == cudaSuccess);
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  NcclWorld world(device, compute);
  Communicator& nccl = *world.nccl;
  const int r = nccl.rank(), n = nccl.size();
  // Large enough that a copy racing the collective would be seen: the input is written by the compute
  // stream (the collective must follow it), the result read by the compute stream after join() (which must
  // follow the collective); the host waits only at the end.
  const int64_t k = int64_t{1} << 24;
  float* host = nullptr;
  REQUIRE(cudaMallocHost(&host, k * sizeof(float)) == cudaSuccess);
  for (int64_t i = 0; i < k; ++i) host[i] = static_cast<float>(r + 1);
  DeviceBuffer<float> buf(std::vector<float>(static_cast<size_t>(k), 0.0f));
  REQUIRE(cudaMemcpyAsync(buf.ptr, host, k * sizeof(float), cudaMemcpyHostToDevice, compute) == cudaSuccess);
  Work w = nccl.all_reduce(buf.ptr, k, DType::kF32);
  w.join();
  REQUIRE(cudaMemcpyAsync(host, buf.ptr, k * sizeof(float), cudaMemcpyDeviceToHost, compute) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  const float want = static_cast<float>(n * (n + 1) / 2);
  int64_t wrong = 0;
  for (int64_t i = 0; i < k; ++i) wrong += host[i] != want ? 1 : 0;
  CHECK(wrong == 0);
  w.wait();
  CHECK(w.is_done());
  cudaFreeHost(host);
  world.nccl.reset();
  cudaStreamDestroy(compute);
}

}  // namespace
}  // namespace gpt
