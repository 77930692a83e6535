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

// A tensor's element size in bytes.
int64_t esize(ConstTensorPtr t) { return static_cast<int64_t>(dtype_size(t.dtype)); }

// The elements the spans cover.
int64_t span_elements(const std::vector<OptimSpan>& spans) {
  int64_t n = 0;
  for (const OptimSpan& s : spans) n += s.length;
  return n;
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

void CudaBackend::embedding_forward(float* out, const int32_t* tokens, ConstTensorPtr wte, ConstTensorPtr wpe, int B,
                                    int T, int C) {
  const OpTimer timed = time_op("embedding_forward", byte_work(int64_t{B} * T * C * (4 + esize(wte)) +
                                                               int64_t{T} * C * esize(wpe) + int64_t{B} * T * 4));
  cuda::embedding_forward(out, tokens, wte, wpe, B, T, C, stream_);
}
void CudaBackend::embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                                     int C) {
  const OpTimer timed = time_op("embedding_backward", byte_work(int64_t{B} * T * (4 * C + 4) + 2 * int64_t{T} * C * 4));
  cuda::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, scratch(cuda::embedding_backward_scratch_bytes(B, T)),
                           stream_);
}
// Under bf16 compute the GEMM's inputs are bf16: bf16 operands (the model's LayerNorm and GELU outputs, and the
// weights when the ParamSource holds them in bf16) go in as they are; fp32 ones are cast into the cast areas.
const bf16* CudaBackend::gemm_input(int slot, ConstTensorPtr x, int64_t n) {
  if (x.is_bf16()) return x.as_bf16();
  bf16* area = cast_area(slot, n);
  cuda::cast_to_bf16(area, x.as_f32(), n, stream_);
  return area;
}
// The bias in the output's dtype, as Matmul adds it (cuBLASLt's bias epilogue takes a vector of D's type): the
// bias itself when it is so (a bf16 one 16-byte aligned, as the epilogue needs: Matmul adds an unaligned fp32 one
// with a kernel), else rounded, widened or copied into cast area 3 (cudaMalloc'd, so aligned).
const void* CudaBackend::gemm_bias(ConstTensorPtr bias, DType out_type, int OC) {
  if (bias.data == nullptr) return nullptr;
  const bool aligned = reinterpret_cast<uintptr_t>(bias.data) % 16 == 0;
  if (bias.dtype == out_type && (out_type == DType::kF32 || aligned)) return bias.data;
  if (out_type == DType::kBF16) {
    bf16* area = cast_area(3, OC);
    if (bias.is_bf16()) {
      GPT_CUDA_CHECK(cudaMemcpyAsync(area, bias.data, OC * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
    } else {
      cuda::cast_to_bf16(area, bias.as_f32(), OC, stream_);
    }
    return area;
  }
  auto* area = reinterpret_cast<float*>(cast_area(3, 2 * static_cast<int64_t>(OC)));  // OC floats
  cuda::cast_from_bf16(area, bias.as_bf16(), OC, stream_);
  return area;
}
void CudaBackend::matmul_forward(TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias,
                                 int64_t N, int C, int OC, int64_t ld_out) {
  const OpTimer timed = time_op("matmul_forward", flop_work(2.0 * N * C * OC), {N, C, OC});
  if (compute_dtype_ == DType::kF32) {
    matmul_->forward(out.as_f32(), DType::kF32, inp.as_f32(), weight.as_f32(), DType::kF32,
                     gemm_bias(bias, DType::kF32, OC), N, C, OC, ld_out);
    return;
  }
  const bf16* a = gemm_input(0, inp, N * C);
  const bf16* w = gemm_input(1, weight, static_cast<int64_t>(OC) * C);
  matmul_->forward(out.data, out.dtype, a, w, DType::kBF16, gemm_bias(bias, out.dtype, OC), N, C, OC, ld_out);
}
void CudaBackend::matmul_backward(TensorPtr dinp, float* dweight, float* dbias, ConstTensorPtr dout, ConstTensorPtr inp,
                                  ConstTensorPtr weight, int64_t N, int C, int OC, int64_t ld_dout) {
  const OpTimer timed = time_op(
      "matmul_backward", flop_work(2.0 * N * C * OC * ((dinp.data != nullptr) + (dweight != nullptr))), {N, C, OC});
  void* s = dbias != nullptr ? scratch(cuda::bias_backward_scratch_bytes(N, OC)) : nullptr;
  if (compute_dtype_ == DType::kF32) {
    matmul_->backward(dinp.as_f32(), dweight, dbias, dout.as_f32(), inp.as_f32(), weight.as_f32(), DType::kF32, N, C,
                      OC, ld_dout, s);
    return;
  }
  const bf16* a = gemm_input(0, inp, N * C);
  const bf16* w = gemm_input(1, weight, static_cast<int64_t>(OC) * C);
  const bf16* d = gemm_input(2, dout, N * ld_dout);
  matmul_->backward(dinp, dweight, dbias, d, a, w, DType::kBF16, N, C, OC, ld_dout, s);  // dbias sums the bf16 d
}
void CudaBackend::bias_backward(float* dbias, ConstTensorPtr dout, int64_t N, int OC) {
  if (N == 0) return;
  const OpTimer timed = time_op("bias_backward", byte_work(N * OC * esize(dout)));
  // As matmul_backward takes dout: under bf16 compute its bf16 rounding.
  const ConstTensorPtr d =
      compute_dtype_ == DType::kF32 ? ConstTensorPtr(dout.as_f32()) : ConstTensorPtr(gemm_input(2, dout, N * OC));
  cuda::bias_backward(dbias, d, N, OC, OC, scratch(cuda::bias_backward_scratch_bytes(N, OC)), stream_);
}
bool CudaBackend::gelu_fused(GeluFusion level, int64_t rows, std::initializer_list<ConstTensorPtr> gelu_tensors) const {
  if (static_cast<int>(gelu_fusion_) < static_cast<int>(level) || compute_dtype_ != DType::kBF16) return false;
  if (!cuda::Matmul::gelu_fusable(rows)) return false;
  for (const ConstTensorPtr& t : gelu_tensors) {
    if (!t.is_bf16() || reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  }
  return true;
}
bool CudaBackend::gelu_backward_fused(int C) const {
  return gelu_fusion_ == GeluFusion::kFull && compute_dtype_ == DType::kBF16 && cuda::Matmul::gelu_fusable(C);
}
void CudaBackend::matmul_gelu_forward(TensorPtr pre, TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight,
                                      ConstTensorPtr bias, int64_t N, int C, int OC) {
  if (!gelu_fused(GeluFusion::kForward, OC, {pre, out})) {
    Backend::matmul_gelu_forward(pre, out, inp, weight, bias, N, C, OC);
    return;
  }
  const OpTimer timed = time_op("matmul_gelu_forward", flop_work(2.0 * N * C * OC), {N, C, OC});
  const bf16* a = gemm_input(0, inp, N * C);
  const bf16* w = gemm_input(1, weight, static_cast<int64_t>(OC) * C);
  const auto* b = static_cast<const bf16*>(gemm_bias(bias, DType::kBF16, OC));
  matmul_->forward_gelu(out.as_bf16(), pre.as_bf16(), a, w, b, N, C, OC);
}
void CudaBackend::matmul_backward_gelu(TensorPtr dpre, float* dpre_bias, TensorPtr dinp, float* dweight, float* dbias,
                                       ConstTensorPtr dout, ConstTensorPtr inp, ConstTensorPtr weight,
                                       ConstTensorPtr pre, int64_t N, int C, int OC) {
  if (!gelu_fused(GeluFusion::kFull, C, {dpre, pre})) {
    // The fc bias's gradient summed by the GELU backward as it stores dpre, where dpre is what matmul_backward would
    // take (its dtype the compute dtype): bias_backward of it, bit for bit (column_partials' order either way).
    if (dpre_bias == nullptr || dpre.dtype != compute_dtype_ || dinp.data == nullptr || N == 0) {
      Backend::matmul_backward_gelu(dpre, dpre_bias, dinp, dweight, dbias, dout, inp, weight, pre, N, C, OC);
      return;
    }
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    const OpTimer timed = time_op("gelu_backward_bias", byte_work(N * C * (esize(dpre) + esize(pre) + esize(dinp))));
    cuda::gelu_backward_bias(dpre, dpre_bias, pre, dinp, N, C, scratch(cuda::bias_backward_scratch_bytes(N, C)),
                             stream_);
    return;
  }
  bool summed = false;  // dpre_bias, by the DGELU GEMM's epilogue
  {
    const OpTimer timed =
        time_op("matmul_backward_gelu", flop_work(2.0 * N * C * OC * (1 + (dweight != nullptr))), {N, C, OC});
    void* s = dbias != nullptr || dpre_bias != nullptr ? scratch(cuda::Matmul::backward_dgelu_scratch_bytes(N, C, OC))
                                                       : nullptr;
    const bf16* a = gemm_input(0, inp, N * C);
    const bf16* w = gemm_input(1, weight, static_cast<int64_t>(OC) * C);
    const bf16* d = gemm_input(2, dout, N * OC);
    summed = matmul_->backward_dgelu(dpre.as_bf16(), pre.as_bf16(), dpre_bias, dweight, dbias, d, a, w, N, C, OC, s);
  }
  // Timed on its own (a timed op inside another is left out); unless the DGELU GEMM's epilogue summed it
  // (GPT_GEMM_DGELU_BGRAD=1, an experiment).
  if (dpre_bias != nullptr && !summed) bias_backward(dpre_bias, dpre, N, C);
}
void CudaBackend::layernorm_forward(TensorPtr out, float* mean, float* rstd, const float* inp, ConstTensorPtr weight,
                                    ConstTensorPtr bias, int64_t N, int C) {
  const OpTimer timed =
      time_op("layernorm_forward", byte_work(N * C * (4 + esize(out)) + 8 * N + 2 * int64_t{C} * esize(weight)));
  cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, stream_);
}
void CudaBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, ConstTensorPtr dout, const float* inp,
                                     ConstTensorPtr weight, const float* mean, const float* rstd, int64_t N, int C,
                                     bf16* dinp_lo) {
  const OpTimer timed = time_op(
      "layernorm_backward",
      byte_work(N * C * (12 + esize(dout) + (dinp_lo != nullptr ? 2 : 0)) + 8 * N + int64_t{C} * (esize(weight) + 16)));
  cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, dinp_lo,
                           scratch(cuda::layernorm_backward_scratch_bytes(N, C)), stream_);
}
void CudaBackend::residual_layernorm_forward(float* res_out, TensorPtr out, float* mean, float* rstd, const float* res,
                                             ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N,
                                             int C, const DropoutMask& drop) {
  const OpTimer timed = time_op("residual_layernorm_forward", byte_work(N * C * (8 + esize(inp) + esize(out)) + 8 * N +
                                                                        2 * int64_t{C} * esize(weight)));
  cuda::residual_layernorm_forward(res_out, out, mean, rstd, res, inp, weight, bias, N, C, drop, stream_);
}
// Under bf16 compute, the tensor-core kernels for the head sizes they cover and 16-byte aligned tensors (they
// move 16 bytes at a time): the mma.sync ones (attention_mma.cu) where every tensor but dout is bf16 and
// run.attention_kernel is auto, else the WMMA ones (attention_tc.cu); else the fp32 kernels.
CudaBackend::AttentionPath CudaBackend::attention_path(int C, int NH, std::initializer_list<ConstTensorPtr> tensors,
                                                       const void* dout) const {
  if (compute_dtype_ != DType::kBF16 || !cuda::attention_tc_supported(C, NH)) return AttentionPath::kFp32;
  if (reinterpret_cast<uintptr_t>(dout) % 16 != 0) return AttentionPath::kFp32;
  bool bf16 = true;
  for (const ConstTensorPtr& t : tensors) {
    if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return AttentionPath::kFp32;
    bf16 = bf16 && t.is_bf16();
  }
  // The kernels asked for, then those that fit this GPU's shared memory per block (the mma.sync ones take 102 KB at
  // head size 128, over the 99 KB of sm_86/sm_89; the WMMA ones 77.5 KB; the fp32 ones 73 KB).
  const bool mma = attention_kernel_ == AttentionKernel::kAuto && bf16 && cuda::attention_mma_supported(C, NH);
  const size_t mma_bytes = mma ? cuda::attention_mma_smem_bytes(C, NH) : 0;
  if (mma && mma_bytes <= smem_per_block_) return AttentionPath::kMma;
  const size_t tc_bytes = cuda::attention_tc_smem_bytes(C, NH);
  const AttentionPath path = tc_bytes <= smem_per_block_ ? AttentionPath::kWmma : AttentionPath::kFp32;
  if (!attention_fallback_logged_ && (mma || path == AttentionPath::kFp32)) {
    attention_fallback_logged_ = true;
    char msg[256];
    std::snprintf(msg, sizeof(msg),
                  "attention at head size %d: the %s kernels take %zu bytes of shared memory per block, this GPU "
                  "allows %zu: running the %s kernels",
                  C / NH, mma ? "mma.sync" : "WMMA", mma ? mma_bytes : tc_bytes, smem_per_block_,
                  path == AttentionPath::kWmma ? "WMMA" : "fp32");
    log_warning(msg);
  }
  return path;
}
void CudaBackend::attention_forward(TensorPtr out, float* att, ConstTensorPtr qkv, int B, int T, int C, int NH,
                                    const DropoutMask& drop) {
  const OpTimer timed = time_op("attention_forward", flop_work(2.0 * B * T * T * C));
  switch (attention_path(C, NH, {out, qkv})) {
    case AttentionPath::kMma:
      cuda::attention_forward_mma(out, att, qkv, B, T, C, NH, drop, stream_);
      break;
    case AttentionPath::kWmma:
      cuda::attention_forward_tc(out, att, qkv, B, T, C, NH, drop, stream_);
      break;
    case AttentionPath::kFp32:
      cuda::attention_forward(out, att, qkv, B, T, C, NH, drop, stream_);
      break;
  }
}
void CudaBackend::attention_backward(TensorPtr dqkv, ConstTensorPtr dout, ConstTensorPtr qkv, ConstTensorPtr out,
                                     const float* att, int B, int T, int C, int NH, const DropoutMask& drop,
                                     float* dqkv_bias) {
  const OpTimer timed = time_op("attention_backward", flop_work(5.0 * B * T * T * C));
  bool bias_summed = false;  // by the wgmma kernels (sm_90), as they store dqkv
  const AttentionPath path = attention_path(C, NH, {dqkv, qkv, out}, dout.data);
  // The tensor-core kernels take dO in bf16 (the model's is: the projection GEMM's input gradient), for D as well; an
  // fp32 one (tests, fp32 callers) is rounded into cast area 0 first, as a GEMM input would be (grown on use), so the
  // mma.sync and WMMA kernels give the same bits for either.
  const bf16* dob = path != AttentionPath::kFp32 ? gemm_input(0, dout, int64_t{B} * T * C) : nullptr;
  switch (path) {
    case AttentionPath::kMma:
      bias_summed = cuda::attention_backward_mma(
          dqkv, dob, qkv, out, att, B, T, C, NH, drop, dqkv_bias,
          scratch(cuda::attention_backward_mma_scratch_bytes(B, T, C, NH, drop.active())), stream_);
      break;
    case AttentionPath::kWmma:
      cuda::attention_backward_tc(dqkv, dob, qkv, out, att, B, T, C, NH, drop,
                                  scratch(cuda::attention_backward_scratch_bytes(B, T, C, NH)), stream_);
      break;
    case AttentionPath::kFp32:
      cuda::attention_backward(dqkv, dout, qkv, out, att, B, T, C, NH, drop,
                               scratch(cuda::attention_backward_scratch_bytes(B, T, C, NH)), stream_);
      break;
  }
  // Otherwise matmul_backward's kernel, bit for bit (the scratch is free again: stream order).
  if (dqkv_bias != nullptr && !bias_summed) bias_backward(dqkv_bias, dqkv, int64_t{B} * T, 3 * C);
}
// Sampling's attention over its KV cache: one simple kernel for every dtype and head size (no tensor cores).
void CudaBackend::attention_forward_rows(TensorPtr out, ConstTensorPtr qkv, int T, int t0, int C, int NH) {
  const OpTimer timed = time_op("attention_forward_rows", flop_work(4.0 * (T - t0) * T * C));
  cuda::attention_forward_rows(out, qkv, T, t0, C, NH, stream_);
}
void CudaBackend::gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N) {
  const OpTimer timed = time_op("gelu_forward", byte_work(N * (esize(inp) + esize(out))));
  cuda::gelu_forward(out, inp, N, stream_);
}
void CudaBackend::gelu_backward(TensorPtr dinp, ConstTensorPtr inp, ConstTensorPtr dout, int64_t N) {
  const OpTimer timed = time_op("gelu_backward", byte_work(N * (esize(dinp) + esize(inp) + esize(dout))));
  cuda::gelu_backward(dinp, inp, dout, N, stream_);
}
void CudaBackend::residual_forward(float* out, const float* res, ConstTensorPtr inp, int64_t N,
                                   const DropoutMask& drop) {
  const OpTimer timed = time_op("residual_forward", byte_work((8 + esize(inp)) * N));
  cuda::residual_forward(out, res, inp, N, drop, stream_);
}
void CudaBackend::dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop) {
  const OpTimer timed = time_op("dropout_backward", byte_work(drop.active() || dinp != dout ? 8 * N : 0));
  cuda::dropout_backward(dinp, dout, N, drop, stream_);
}
void CudaBackend::dropout_forward(float* x, int64_t N, const DropoutMask& drop) {
  const OpTimer timed = time_op("dropout_forward", byte_work(drop.active() ? 8 * N : 0));  // inactive: nothing runs
  cuda::dropout_forward(x, N, drop, stream_);
}
void CudaBackend::crossentropy_forward_backward(float* losses, TensorPtr dlogits, ConstTensorPtr logits,
                                                const int32_t* targets, int64_t N, int V, int Vp, float dloss) {
  const OpTimer timed = time_op(
      "crossentropy_forward_backward",
      byte_work(N * V * esize(logits) + (dlogits.data != nullptr ? N * int64_t{Vp} * esize(dlogits) : 0) + 8 * N));
  cuda::crossentropy_forward_backward(losses, dlogits, logits, targets, N, V, Vp, dloss, stream_);
}
void CudaBackend::adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, float grad_scale, int64_t step) {
  const OpTimer timed = time_op("adamw_update", byte_work(28 * n));
  cuda::adamw_update(param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step, stream_);
}
double CudaBackend::sum_squares(const float* x, int64_t n) {
  const OpTimer timed = time_op("sum_squares", byte_work(4 * n));
  cuda::sum_squares(result_.as<double>(), x, n, scratch(cuda::sum_squares_scratch_bytes()), stream_);
  GPT_CUDA_CHECK(cudaMemcpyAsync(result_host_, result_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return *result_host_;
}
void CudaBackend::adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo,
                                     const std::vector<OptimSpan>& spans, const AdamWStep& step,
                                     const Bf16Rounding& rounding) {
  const OpTimer timed =
      time_op("adamw_update_spans", byte_work(span_elements(spans) * (28 + (param_lo != nullptr ? 2 : 0))));
  cuda::adamw_update_spans(param, m, v, grad, param_lo, span_table(spans), step, rounding, stream_);
}
double CudaBackend::sum_squares_spans(const float* x, const std::vector<OptimSpan>& spans) {
  const OpTimer timed = time_op("sum_squares_spans", byte_work(4 * span_elements(spans)));
  const cuda::SpanTable& t = span_table(spans);
  cuda::sum_squares_spans(result_.as<double>(), x, t, scratch(cuda::sum_squares_spans_scratch_bytes(t)), stream_);
  GPT_CUDA_CHECK(cudaMemcpyAsync(result_host_, result_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return *result_host_;
}
void CudaBackend::round_to_bf16_spans(bf16* dst, const float* src, const std::vector<OptimSpan>& spans,
                                      const Bf16Rounding& rounding) {
  const OpTimer timed = time_op("round_to_bf16_spans", byte_work(6 * span_elements(spans)));
  cuda::round_to_bf16_spans(dst, src, span_table(spans), rounding, stream_);
}
void CudaBackend::fill_zero(float* x, int64_t n) {
  const OpTimer timed = time_op("fill_zero", byte_work(4 * n));
  if (n > 0) GPT_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream_));
}
void CudaBackend::cast_to_bf16(bf16* dst, const float* src, int64_t n) {
  const OpTimer timed = time_op("cast_to_bf16", byte_work(6 * n));
  cuda::cast_to_bf16(dst, src, n, stream_);
}
void CudaBackend::cast_from_bf16(float* dst, const bf16* src, int64_t n) {
  const OpTimer timed = time_op("cast_from_bf16", byte_work(6 * n));
  cuda::cast_from_bf16(dst, src, n, stream_);
}
void CudaBackend::copy(float* dst, const float* src, int64_t n) {
  const OpTimer timed = time_op("copy", byte_work(8 * n));
  if (n > 0) GPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

}  // namespace gpt
