// The CudaBackend's lifecycle, device memory, transfers and profile (its ops are in cuda_backend_ops.cu).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#include "comm/device_select.h"
#include "core/logging.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/switches.h"
#include "kernels/cuda/workspace.h"

namespace gpt {

namespace {

// At process exit the runtime may already be unloading; the memory goes with the process then. Buffers are freed
// at teardown (and when a first step grows an area), where work on another stream may still use them: a
// collective of the NCCL communicators, which outlive the parameters. cudaFree only "may perform implicit
// synchronization" (cuda_runtime_api.h), so the device is synchronised first.
void cuda_free(void* p) {
  const cudaError_t sync = cudaDeviceSynchronize();
  if (sync == cudaErrorCudartUnloading) return;
  GPT_CUDA_CHECK(sync);
  const cudaError_t err = cudaFree(p);
  if (err != cudaErrorCudartUnloading) GPT_CUDA_CHECK(err);
}

}  // namespace

Expected<std::unique_ptr<Backend>> make_cuda_backend(int local_rank, int local_size) {
  if (const std::string bad = cuda_switches::first_error(); !bad.empty()) {
    return Status::invalid_argument("device 'cuda': environment " + bad);
  }
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return Status::failed_precondition(std::string("device 'cuda': no CUDA device is visible (") +
                                       cudaGetErrorString(err) + ")");
  }
  auto device = device_for_local_rank(local_rank, local_size, count);
  if (!device) return device.status().with_context("device 'cuda'");
  if (count == 1 && local_size > 1 && local_rank == 0) {  // once a node
    log_warning(
        "device 'cuda': each of this node's " + std::to_string(local_size) +
        " ranks sees one GPU (e.g. srun --gpus-per-task; if one CUDA_VISIBLE_DEVICES names the same GPU for all, "
        "the start fails further on: ranks may not share a GPU): NCCL finds NVLink between the ranks' GPUs only where "
        "each rank can see the others' (CUDA IPC), which a site that isolates each task's GPUs (cgroups) forbids; "
        "then it falls back to PCIe or host memory, slowly. The scripts/slurm templates give every rank all of the "
        "node's GPUs (--gpus-per-node) and each takes the one of its local rank");
  }
  // The kernels are built for sm_80 and sm_90 (mma.sync, ldmatrix, cp.async, bf16): an older GPU would fail at the
  // first launch with "no kernel image is available".
  int major = 0, minor = 0;
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, *device));
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, *device));
  if (major < 8) {
    cudaDeviceProp prop;
    GPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, *device));
    return Status::failed_precondition("device 'cuda': GPU " + std::to_string(*device) + " (" + prop.name +
                                       ") has compute capability " + std::to_string(major) + "." +
                                       std::to_string(minor) +
                                       "; gpt-train's CUDA kernels need 8.0 or newer (A100, H100 and later): set "
                                       "run.device: cpu on this machine");
  }
  GPT_CUDA_CHECK(cudaSetDevice(*device));  // the algorithm cache is for this GPU
  if (const Status st = cuda::check_gemm_algo_cache(); !st.is_ok()) return st.with_context("device 'cuda'");
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(*device));
}

CudaBackend::CudaBackend(int device) : device_(device) {
  GPT_CUDA_CHECK(cudaSetDevice(device_));
  int smem = 0;
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
  smem_per_block_ = static_cast<size_t>(smem);
  GPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  profile_ = cuda::env_is("GPT_TRAIN_CUDA_PROFILE", "1");
  cublas_workspace_ = alloc(cuda_workspace::kCublasLtBytes, MemCategory::kWorkspace);
  if (cuda_workspace::wgrad_stream_enabled()) {  // the experiment (kernels.h, Matmul)
    GPT_CUDA_CHECK(cudaStreamCreateWithFlags(&wgrad_stream_, cudaStreamNonBlocking));
    wgrad_workspace_ = alloc(cuda_workspace::kCublasLtBytes, MemCategory::kWorkspace);
    log_info("GPT_GEMM_WGRAD_STREAM=1: weight gradients on a second stream (another " +
             std::to_string(cuda_workspace::kCublasLtBytes >> 20) + " MiB cuBLASLt workspace)");
#ifdef GPT_CUDA_EMULATOR
    // The emulator runs this stream's work as soon as it is queued (and what it waits for first), where the main
    // stream's waits until needed: a gradient not ordered after its inputs reads them unwritten there.
    emu_stream_run_early(wgrad_stream_);
#endif
  }
  matmul_ = std::make_unique<cuda::Matmul>(stream_, cublas_workspace_.data(), wgrad_stream_, wgrad_workspace_.data());
  result_ = alloc(sizeof(double), MemCategory::kWorkspace);
  GPT_CUDA_CHECK(cudaMallocHost(&result_host_, sizeof(double)));
  // The staging slots at their full size now: a cudaMallocHost in the step loop would synchronise the device.
  for (Staging& st : staging_) {
    GPT_CUDA_CHECK(cudaMallocHost(&st.host, kStagingBytes));
    GPT_CUDA_CHECK(cudaEventCreateWithFlags(&st.read, cudaEventDisableTiming));
    GPT_CUDA_CHECK(cudaEventRecord(st.read, stream_));  // so that to_device's first wait on it has work to wait for
  }
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  for (Staging& st : staging_) {
    cudaEventDestroy(st.read);
    cudaFreeHost(st.host);
  }
  for (cudaEvent_t e : op_events_) cudaEventDestroy(e);
  scratch_.release();
  span_tables_.clear();
  for (Buffer& b : cast_) b.release();
  result_.release();
  if (wgrad_stream_ != nullptr) cudaStreamSynchronize(wgrad_stream_);
  matmul_.reset();
  wgrad_workspace_.release();
  cublas_workspace_.release();
  cudaFreeHost(result_host_);
  if (wgrad_stream_ != nullptr) cudaStreamDestroy(wgrad_stream_);
  cudaStreamDestroy(stream_);
}

CudaBackend::OpTimer::OpTimer(CudaBackend* be, const char* op, OpWork work, OpShape shape)
    : be_(be), op_(op), work_(work), shape_(shape) {
  if (be_ != nullptr) start_ = be_->record_op_event();
}

CudaBackend::OpTimer::~OpTimer() {
  if (be_ == nullptr) return;
  const size_t stop = be_->record_op_event();
  if (stop != start_ + 1) return;  // another timed op ran inside this one (none does): left out, not mis-timed
  be_->pending_ops_.push_back({op_, shape_, work_, start_});
}

size_t CudaBackend::record_op_event() {
  if (next_op_event_ == kMaxOpEvents) {  // full: wait for the stream once and start over
    GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    read_op_times();
  }
  if (next_op_event_ == op_events_.size()) {
    cudaEvent_t e = nullptr;
    GPT_CUDA_CHECK(cudaEventCreate(&e));
    op_events_.push_back(e);
  }
  GPT_CUDA_CHECK(cudaEventRecord(op_events_[next_op_event_], stream_));
  return next_op_event_++;
}

void CudaBackend::read_op_times() const {
  for (const PendingOp& p : pending_ops_) {
    float ms = 0.0f;
    GPT_CUDA_CHECK(cudaEventElapsedTime(&ms, op_events_[p.start], op_events_[p.start + 1]));
    auto it = std::find_if(op_times_.begin(), op_times_.end(),
                           [&](const OpTime& t) { return std::strcmp(t.op, p.op) == 0 && t.shape == p.shape; });
    if (it == op_times_.end()) it = op_times_.insert(op_times_.end(), OpTime{p.op, p.shape});
    it->ms += ms;
    ++it->calls;
    it->work.flops += p.work.flops;
    it->work.bytes += p.work.bytes;
  }
  pending_ops_.clear();
  next_op_event_ = 0;
}

std::string CudaBackend::profile_report() const {
  if (!profile_) return {};
  GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  read_op_times();
  std::vector<OpTime> sorted = op_times_;
  std::sort(sorted.begin(), sorted.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  double total = 0.0;
  for (const OpTime& t : sorted) total += t.ms;
  std::string out =
      "CUDA op time (GPT_TRAIN_CUDA_PROFILE=1; events before and after each op, ops back to back; GEMMs by shape, "
      "op_N_C_OC: N rows, C in, OC out):\n";
  char line[240];
  std::snprintf(line, sizeof(line), "  %-40s %10s %8s %10s %6s %16s %14s\n", "op", "total ms", "calls", "ms/call", "%",
                "least work/call", "rate");
  out += line;
  for (const OpTime& t : sorted) {
    const double calls = static_cast<double>(t.calls);
    // The op's least work (OpWork) per call, and that work over the op's time: against the GPU's peak (H100/H200
    // SXM: 989 dense bf16 TFLOP/s; H200 4.8 TB/s, H100 3.35 TB/s, by the datasheets), how far it is from its bound.
    char work[32] = "-", rate[32] = "-";
    if (t.work.flops > 0) {
      std::snprintf(work, sizeof(work), "%.4g GFLOP", t.work.flops / calls * 1e-9);
      if (t.ms > 0) std::snprintf(rate, sizeof(rate), "%.1f TFLOP/s", t.work.flops / (t.ms * 1e9));
    } else if (t.work.bytes > 0) {
      std::snprintf(work, sizeof(work), "%.4g MB", t.work.bytes / calls * 1e-6);
      if (t.ms > 0) std::snprintf(rate, sizeof(rate), "%.0f GB/s", t.work.bytes / (t.ms * 1e6));
    }
    std::string name = t.op;
    if (t.shape != OpShape{}) {
      for (const int64_t d : t.shape) {
        name += '_';
        name += std::to_string(d);  // (not "_" + std::to_string(d): GCC 12's -Wrestrict false positive)
      }
    }
    std::snprintf(line, sizeof(line), "  %-40s %10.2f %8lld %10.4f %5.1f%% %16s %14s\n", name.c_str(), t.ms,
                  static_cast<long long>(t.calls), t.ms / calls, total > 0 ? 100.0 * t.ms / total : 0.0, work, rate);
    out += line;
  }
  std::snprintf(line, sizeof(line), "  %-40s %10.2f\n", "total", total);
  out += line;
  return out;
}

void CudaBackend::profile_restart() {
  if (!profile_) return;
  GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  read_op_times();
  op_times_.clear();
}

double CudaBackend::peak_flops() const {
  cudaDeviceProp prop{};
  GPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  const std::string name = prop.name;
  // Dense bf16 tensor-core peaks from the datasheets (SXM parts); others are unknown: set logging.peak_tflops.
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989e12;
  if (name.find("A100") != std::string::npos) return 312e12;
  return 0.0;
}

namespace {

// What alloc asks cudaMalloc for `bytes`: whole 256-byte pieces.
size_t malloc_bytes(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

std::optional<DeviceMemory> CudaBackend::device_memory() const {
  size_t free = 0, total = 0;
  GPT_CUDA_CHECK(cudaSetDevice(device_));  // cudaMemGetInfo counts the calling thread's current device
  GPT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return DeviceMemory{static_cast<int64_t>(total), static_cast<int64_t>(free),
                      static_cast<int64_t>(malloc_bytes(cublas_workspace_.bytes()) +
                                           malloc_bytes(wgrad_workspace_.bytes()) + malloc_bytes(result_.bytes()))};
}

namespace {

std::string mib(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return s;
}

}  // namespace

Buffer CudaBackend::alloc(size_t bytes, MemCategory category) {
  if (bytes == 0) return Buffer();
  void* p = nullptr;
  const size_t rounded = malloc_bytes(bytes);
  const cudaError_t err = cudaMalloc(&p, rounded);
  if (err == cudaErrorMemoryAllocation) {  // the plan fitted at the start (Trainer::create): say what changed
    (void)cudaGetLastError();
    size_t free = 0, total = 0;
    (void)cudaMemGetInfo(&free, &total);
    const MemStats m = MemTracker::instance().stats();
    const std::string msg =
        "GPU " + std::to_string(device_) + " is out of memory: " + mib(static_cast<double>(rounded)) + " for " +
        std::string(mem_category_name(category)) + " did not fit in the " + mib(static_cast<double>(free)) +
        " free of " + mib(static_cast<double>(total)) + "; gpt-train's buffers hold " +
        mib(static_cast<double>(m.total_current)) + " in " + std::to_string(m.live_buffers) +
        " buffers. A training run's plan fitted in the free memory at its start less "
        "parallel.device_memory_reserve_gb, so more than that reserve went elsewhere since (NCCL's buffers, "
        "another process on this GPU): raise it, or choose what needs less (`gpt-train plan`)";
    GPT_CHECK_MSG(false, msg.c_str());
  }
  GPT_CUDA_CHECK(err);
  GPT_CUDA_CHECK(cudaMemsetAsync(p, 0, rounded, stream_));
  return Buffer::adopt(p, bytes, category, cuda_free);
}

// The areas as cuda_workspace::step_areas computes them for the planner, with cub's real sort storage.
void CudaBackend::reserve(int B, int T, int C, int NH, int V, int64_t head_rows, bool dropout) {
  const cuda_workspace::StepAreas a =
      cuda_workspace::step_areas({B, T, C, NH, V, head_rows, dropout}, compute_dtype_ == DType::kBF16,
                                 cuda::embedding_backward_scratch_bytes(B, T));
  scratch(a.scratch);
  for (int slot = 0; slot < 4; ++slot) {
    if (a.cast[slot] > 0) cast_area(slot, a.cast[slot]);
  }
}

// A list of spans is fixed for an optimizer's life (AdamW's runs, ShardedParams' regions): its table is
// written to device memory of its own on first use (the first step) and found again by content after that.
const cuda::SpanTable& CudaBackend::span_table(const std::vector<OptimSpan>& spans) {
  for (const SpanTableEntry& e : span_tables_) {
    if (e.spans == spans) return e.table;  // every field: lo_shift too, or a table would write another layout
  }
  SpanTableEntry e;
  e.spans = spans;
  e.memory = alloc(cuda::span_table_bytes(spans), MemCategory::kWorkspace);
  e.table = cuda::write_span_table(spans, e.memory.data(), stream_);
  span_tables_.push_back(std::move(e));
  return span_tables_.back().table;
}

bf16* CudaBackend::cast_area(int slot, int64_t n) {
  Buffer& b = cast_[slot];
  const size_t bytes = static_cast<size_t>(n) * sizeof(bf16);
  if (b.bytes() < bytes) {
    GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // queued kernels may still read the old area
    b.release();
    b = alloc(bytes, MemCategory::kWorkspace);
  }
  return b.as<bf16>();
}

void CudaBackend::set_compute_dtype(DType type) {
  GPT_CHECK(type == DType::kF32 || type == DType::kBF16);
  compute_dtype_ = type;
}

Status CudaBackend::set_gelu_fusion(GeluFusion fusion) {
  if (fusion != GeluFusion::kNone && compute_dtype_ != DType::kBF16) {
    return Status::failed_precondition(
        "backend 'cuda': the GELU epilogues are bf16 GEMMs; run.gelu_fusion needs parallel.param_dtype bf16");
  }
  gelu_fusion_ = fusion;
  return Status::ok();
}

Status CudaBackend::set_attention_kernel(AttentionKernel kernel) {
  if (kernel != AttentionKernel::kAuto && compute_dtype_ != DType::kBF16) {
    return Status::failed_precondition(
        "backend 'cuda': the WMMA attention kernels are bf16; run.attention_kernel wmma needs parallel.param_dtype "
        "bf16");
  }
  attention_kernel_ = kernel;
  return Status::ok();
}

void* CudaBackend::scratch(size_t bytes) {
  if (scratch_.bytes() < bytes) {
    GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old area may still be in use by queued kernels
    scratch_.release();
    scratch_ = alloc(bytes, MemCategory::kWorkspace);
  }
  return scratch_.data();
}

// Every upload goes through the pinned staging slots, in pieces of at most kStagingBytes, each slot reused once
// the copy that last read it has run (its event): the host does not wait for the stream (a micro-batch's tokens
// and targets), and the caller may reuse src at once. A cudaMemcpyAsync straight from the caller's pageable memory
// would promise neither: CUDA documents only that it "might be synchronous" (it may also wait for the stream),
// not that it has read src when it returns, and where the GPU reads pageable host memory itself (ATS, HMM) it may
// read it later. The copies are ordered before every later op on the stream.
void CudaBackend::to_device(void* dst, const void* src, size_t bytes) {
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  for (size_t done = 0; done < bytes;) {
    const size_t piece = std::min(bytes - done, kStagingBytes);
    Staging& st = staging_[next_staging_];
    next_staging_ = (next_staging_ + 1) % static_cast<int>(std::size(staging_));
    GPT_CUDA_CHECK(cudaEventSynchronize(st.read));  // the copy that read this slot (four pieces ago) has run
    std::memcpy(st.host, in + done, piece);
    GPT_CUDA_CHECK(cudaMemcpyAsync(out + done, st.host, piece, cudaMemcpyHostToDevice, stream_));
    GPT_CUDA_CHECK(cudaEventRecord(st.read, stream_));
    done += piece;
  }
}

// A download of more than one staging slot (checkpoints, weights: hundreds of MB) goes through the pinned slots as
// uploads do, a piece's copy queued before the host copies the previous piece out, so the device's copies and the
// host's overlap and every device copy runs at pinned memory's rate (a copy into pageable memory is staged by the
// driver, slower, and waits for it). Each slot's event is recorded after the copy that fills it: the host waits for
// it before reading the slot, and a later upload into the slot after it (it marks the slot's last device use either
// way). A small download (the step's losses) is one copy straight into dst.
void CudaBackend::to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (bytes <= kStagingBytes) {
    GPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } else {
    auto* out = static_cast<char*>(dst);
    const auto* in = static_cast<const char*>(src);
    const Staging* pending = nullptr;  // the slot holding the previous piece, at out + pending_at
    size_t pending_at = 0, pending_bytes = 0;
    for (size_t done = 0; done < bytes || pending != nullptr;) {
      const Staging* queued = nullptr;
      const size_t at = done, piece = std::min(bytes - done, kStagingBytes);
      if (done < bytes) {
        Staging& st = staging_[next_staging_];
        next_staging_ = (next_staging_ + 1) % static_cast<int>(std::size(staging_));
        GPT_CUDA_CHECK(cudaEventSynchronize(st.read));  // the slot's last device use (an upload's read) has run
        GPT_CUDA_CHECK(cudaMemcpyAsync(st.host, in + done, piece, cudaMemcpyDeviceToHost, stream_));
        GPT_CUDA_CHECK(cudaEventRecord(st.read, stream_));
        queued = &st;
        done += piece;
      }
      if (pending != nullptr) {
        GPT_CUDA_CHECK(cudaEventSynchronize(pending->read));
        std::memcpy(out + pending_at, pending->host, pending_bytes);
      }
      pending = queued, pending_at = at, pending_bytes = piece;
    }
  }
  if (profile_) read_op_times();
}

void CudaBackend::synchronize() {
  GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (profile_) read_op_times();
}

}  // namespace gpt
