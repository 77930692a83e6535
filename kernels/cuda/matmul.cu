// GEMMs through cuBLASLt, the twin of kernels/cpu/matmul.cc. Our tensors are row-major; cuBLASLt is
// column-major, so each row-major product is issued as its transpose (a row-major (R,K) matrix is a
// column-major (K,R) one):
//   forward   out(N,OC)  = inp(N,C) W(OC,C)^T + b   <=>  out^T(OC,N) = W^T' inp^T, bias epilogue over OC
//   dinp(N,C)            = dout(N,OC) W(OC,C)       <=>  dinp^T(C,N) = W^T(C,OC) dout^T(OC,N)
//   dweight(OC,C)       += dout^T inp               <=>  dweight^T(C,OC) += inp^T(C,N) dout(N,OC)
// fp32 compute without TF32 (CUBLAS_COMPUTE_32F), so results match the CPU to fp32 rounding. With bf16
// inputs (the mixed-precision policy) A and B are bf16 and the tensor cores multiply them, still
// accumulating and writing fp32 (or, for the forward and the input gradient, a bf16 output rounded once); the only
// difference from fp32 is the rounding of the inputs. dbias gets a deterministic fp32 column sum of dout as the GEMMs
// take it (partials over fixed row chunks, then added in chunk order).
#include <cublasLt.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "core/atomic_file.h"
#include "core/logging.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/workspace.h"

#define GPT_CUBLAS_CHECK(call)                                                             \
  do {                                                                                     \
    const cublasStatus_t gpt_st_ = (call);                                                 \
    GPT_CHECK_MSG(gpt_st_ == CUBLAS_STATUS_SUCCESS,                                        \
                  (std::string(#call) + ": " + cublasLtGetStatusString(gpt_st_)).c_str()); \
  } while (0)

namespace gpt::cuda {

namespace {

constexpr size_t kWorkspaceBytes = cuda_workspace::kCublasLtBytes;

// GPT_GEMM_ALGOS=N (2..16; read when a shape is first seen): an experiment for a GPU session. The first call of each
// GEMM shape times the heuristic's first N algorithms, three calls each after one warm-up, keeps the fastest and logs
// every time with the algorithm's configuration (id, tile, split-K and its reduction, stages, cluster) and the
// heuristic's wave count. The weight gradients accumulate into their output (beta 1): for them the output is saved
// to a temporary device buffer (cudaMalloc'd there, outside the memory plan) before the timing and put back after it.
// On an H200 some shapes ran far below the others (the GELU-epilogue GEMMs at 502 TFLOP/s where the same shapes ran at
// 727-779 unfused; the weight gradients of the attention projection at about 320): this says whether cuBLASLt has
// faster algorithms for them. Off by default: the choice depends on timings, so it can differ between runs and ranks,
// and with it the last bits of the results.
int gemm_algos_to_time() {
  const char* v = std::getenv("GPT_GEMM_ALGOS");
  if (v == nullptr) return 1;
  const int n = std::atoi(v);
  return n >= 2 && n <= 16 ? n : 1;
}
// GPT_GEMM_ALGO_CACHE=FILE: the algorithm per GEMM shape kept in FILE, as PyTorch's TunableOp keeps its results
// file. A shape FILE holds takes its algorithm from there, before GPT_GEMM_ALGOS (cuBLASLt must
// accept it: cublasLtMatmulAlgoCheck); a shape it does not hold, timed under GPT_GEMM_ALGOS, is added to it (the file
// rewritten whole, atomically; a run that will time writes it at its start, so that one that cannot stops before its
// timings are lost); otherwise the heuristic's. So one run with GPT_GEMM_ALGOS=8 chooses by timing and every later
// run reuses those choices: the same algorithms, hence the same bits, from run to run and on every rank that reads
// the file (tune with one process: ranks that add to it at once each replace it whole, and the last one's table
// stands). The file says which GPU (name, compute capability) and cuBLASLt version wrote it; another one's is an
// error that names the file, as is a line not in the format. An empty file is an empty cache.
using PlanKey = std::array<int64_t, 16>;
constexpr const char* kCacheTitle = "gpt-train cuBLASLt algorithm cache 1";

struct AlgoFile {
  std::string path;
  std::map<PlanKey, cublasLtMatmulAlgo_t> algos;
};

// The GPU and cuBLASLt the file's algorithms are for (the current device's).
std::string cache_target() {
  int device = 0;
  GPT_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  GPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int major = 0, minor = 0;
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return "for " + std::string(prop.name) + ", compute capability " + std::to_string(major) + "." +
         std::to_string(minor) + ", cuBLASLt " + std::to_string(cublasLtGetVersion());
}

std::string algo_hex(const cublasLtMatmulAlgo_t& algo) {
  unsigned char bytes[sizeof(cublasLtMatmulAlgo_t)];
  std::memcpy(bytes, &algo, sizeof bytes);
  std::string hex;
  for (const unsigned char b : bytes) {
    hex += "0123456789abcdef"[b >> 4];
    hex += "0123456789abcdef"[b & 15];
  }
  return hex;
}

// FILE's table (an empty one where FILE does not exist yet), or an error naming FILE (and its line).
Expected<AlgoFile> read_algo_file(const std::string& path) {
  AlgoFile file{path, {}};
  std::string text;
  if (const Status st = read_file(path, &text); !st.is_ok()) {
    if (st.code() == StatusCode::kNotFound) return file;
    return st.with_context("GPT_GEMM_ALGO_CACHE");
  }
  if (text.empty()) return file;  // created empty (touch): a cache with nothing in it yet
  std::istringstream lines(text);
  std::string line;
  auto next_line = [&] {  // the next line without a CR (a file edited on Windows)
    if (!std::getline(lines, line)) return false;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return true;
  };
  const std::string where = "GPT_GEMM_ALGO_CACHE " + path;
  if (!next_line() || line != kCacheTitle) {
    return Status::invalid_argument(where + ":1: not a gpt-train GEMM algorithm cache (its first line is not '" +
                                    kCacheTitle + "')");
  }
  const std::string target = cache_target();
  if (!next_line() || line != target) {
    return Status::failed_precondition(where + ":2: written " + line + "; this run is " + target +
                                       ": its algorithms are not for this one (delete the file, or set "
                                       "GPT_GEMM_ALGO_CACHE to another)");
  }
  for (int number = 3; next_line(); ++number) {
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::istringstream in(line);
    std::string word, hex;
    PlanKey key{};
    bool ok = static_cast<bool>(in >> word) && word == "gemm";
    for (int64_t& k : key) ok = ok && static_cast<bool>(in >> k);
    ok = ok && static_cast<bool>(in >> word >> hex) && word == "algo" &&
         hex.size() == 2 * sizeof(cublasLtMatmulAlgo_t) && !(in >> word);
    unsigned char bytes[sizeof(cublasLtMatmulAlgo_t)] = {};
    for (size_t i = 0; ok && i < hex.size(); ++i) {
      const char c = hex[i];
      const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      ok = v >= 0;
      bytes[i / 2] = static_cast<unsigned char>(bytes[i / 2] | (v << (i % 2 == 0 ? 4 : 0)));
    }
    if (!ok) {
      return Status::invalid_argument(where + ":" + std::to_string(number) +
                                      ": expected 'gemm' and 16 integers, then 'algo' and " +
                                      std::to_string(2 * sizeof(cublasLtMatmulAlgo_t)) + " hexadecimal digits");
    }
    cublasLtMatmulAlgo_t algo;
    std::memcpy(&algo, bytes, sizeof algo);
    file.algos[key] = algo;
  }
  return file;
}

Status write_algo_file(const AlgoFile& file) {
  std::string text = std::string(kCacheTitle) + "\n" + cache_target() + "\n";
  for (const auto& [key, algo] : file.algos) {
    text += "gemm";
    for (const int64_t k : key) {
      text += ' ';
      text += std::to_string(k);
    }
    text += " algo ";
    text += algo_hex(algo);
    text += '\n';
  }
  // Written under a name of this process's own, then renamed over the file: processes that write it at once (the
  // ranks of one tuning run) each replace it whole, never mix their bytes in one temporary.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string own = file.path + "." + host + "." + std::to_string(::getpid());
  if (Status st = write_file_atomically(own, {std::span<const char>(text.data(), text.size())}); !st.is_ok()) {
    return st.with_context("GPT_GEMM_ALGO_CACHE");
  }
  if (std::rename(own.c_str(), file.path.c_str()) != 0) {
    const Status st =
        Status::io_error("GPT_GEMM_ALGO_CACHE: rename " + own + " to " + file.path + ": " + std::strerror(errno));
    std::remove(own.c_str());
    return st;
  }
  return Status::ok();
}

// An algorithm's configuration in words, for the experiments' logs.
std::string algo_config(const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto zero) {
    decltype(zero) v = zero;
    size_t written = 0;
    return cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) == CUBLAS_STATUS_SUCCESS
               ? std::to_string(v)
               : std::string("?");
  };
  return "id " + get(CUBLASLT_ALGO_CONFIG_ID, int32_t{0}) + " tile " + get(CUBLASLT_ALGO_CONFIG_TILE_ID, uint32_t{0}) +
         " splitk " + get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, int32_t{0}) + " red " +
         get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, uint32_t{0}) + " stages " +
         get(CUBLASLT_ALGO_CONFIG_STAGES_ID, uint32_t{0}) + " cluster " +
         get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, uint16_t{0});
}
// bias_backward's row4: dout's values as stored (bf16 ones widened); one 16-byte fp32 or 8-byte bf16 load per row
// when `vec` (dout and ld 4-element aligned). The same sums, in the same order, on either load path.
template <typename In>
__global__ void bias_partial_kernel(float* partial, const In* dout, int64_t N, int OC, int64_t ld, bool vec) {
  __shared__ float sums[kDbiasRowThreads][kDbiasCols];
  column_partials(sums, partial, N, OC,
                  [&](int64_t n, int oc, float(&v)[4]) { load4_upto(v, dout + n * ld, oc, OC, vec, 0.0f); });
}

// dbias[oc] += the chunks' partials, added in chunk order. One warp per block: OC / 32 blocks spread the columns
// over the SMs; each thread's loads are independent of its adds, so the unrolled loop keeps several in flight.
__global__ void bias_sum_kernel(float* dbias, const float* partial, int64_t chunks, int OC) {
  const int oc = blockIdx.x * blockDim.x + threadIdx.x;
  if (oc >= OC) return;
  float s = 0.0f;
#pragma unroll 8
  for (int64_t c = 0; c < chunks; ++c) s += partial[c * OC + oc];
  dbias[oc] += s;
}

// GPT_GEMM_DGELU_BGRAD=1 (read at each call; an experiment not yet measured on a GPU): the fc bias's gradient from the
// DGELU GEMM's own epilogue (DGELU_BGRAD: the row sums of what it stores, in fp32 before the bf16 rounding) instead
// of bias_backward's pass over dpre (100 MB per layer at GPT-2 124M's batch 16: 46 us on the H200), where cuBLASLt
// has such an algorithm; the sums differ from the kernel's in order and by the rounding, in the last bits. The
// weight-gradient GEMMs' BGRADB epilogue, tried on an H200 (an experiment since removed), made each of them slower
// than the kernel it saved (the qkv's 85 -> 119 us against a 25 us kernel; the fc's 111 -> 152 against 46); this says
// whether the DGELU GEMM, already off cuBLASLt's fastest kernels (140 us where its shape runs in 100 without the
// epilogue), pays as much.
bool dgelu_bgrad_enabled() { return env_is("GPT_GEMM_DGELU_BGRAD", "1"); }

cublasLtHandle_t lt(void* h) { return static_cast<cublasLtHandle_t>(h); }

// The largest power of two up to 256 that divides the address.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// Column-major c(m, n), leading dimension ldc: c[i + j*ldc] += bias[i].
__global__ void add_bias_kernel(float* c, const float* bias, int64_t m, int64_t n, int64_t ldc) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < m * n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k % m, j = k / m;
    c[i + j * ldc] += bias[i];
  }
}

}  // namespace

// Per shape: the descriptors and the heuristic's algorithm, made once (a step repeats a few shapes), so a
// GEMM costs one attribute set (the bias pointer) and the launch in host time.
struct Matmul::AlgoCache {
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool usable = true;  // false: kDGeluBGrad with no algorithm (gemm returns false)
  };
  std::map<std::array<int64_t, 16>, Plan> plans;
  std::optional<AlgoFile> file;  // GPT_GEMM_ALGO_CACHE's
  ~AlgoCache() {
    for (auto& [key, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.lc);
      cublasLtMatrixLayoutDestroy(p.lb);
      cublasLtMatrixLayoutDestroy(p.la);
      cublasLtMatmulDescDestroy(p.op);
    }
  }
};

namespace {

// GPT_GEMM_ALGOS's timing: each of the heuristic's `found` results whose state is success, one warm-up call and three
// timed ones (CUDA events on `stream`); returns the fastest, results[0]'s algorithm where none other runs. Logs the
// times.
template <typename Run>
cublasLtMatmulAlgo_t fastest_algo(const cublasLtMatmulHeuristicResult_t* results, int found, Run run,
                                  cudaStream_t stream, const std::string& shape) {
  cudaEvent_t start = nullptr, stop = nullptr;
  GPT_CUDA_CHECK(cudaEventCreate(&start));
  GPT_CUDA_CHECK(cudaEventCreate(&stop));
  int best = 0;
  float best_ms = -1.0f;
  std::string times;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || run(results[i].algo) != CUBLAS_STATUS_SUCCESS) {
      times += " #" + std::to_string(i) + " -";
      continue;
    }
    GPT_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < 3; ++r) GPT_CUBLAS_CHECK(run(results[i].algo));
    GPT_CUDA_CHECK(cudaEventRecord(stop, stream));
    GPT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    GPT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    ms /= 3.0f;
    times += " #" + std::to_string(i) + " " + std::to_string(ms * 1e3f).substr(0, 7) + "us (" +
             algo_config(results[i].algo) + " waves " + std::to_string(results[i].wavesCount).substr(0, 4) + ")";
    if (best_ms < 0.0f || ms < best_ms) best = i, best_ms = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  log_info("GPT_GEMM_ALGOS: " + shape + ": " + std::to_string(found) + " of the heuristic's algorithms timed:" + times +
           "; chose #" + std::to_string(best));
  return results[best].algo;
}

}  // namespace

Matmul::Matmul(cudaStream_t stream, void* workspace, cudaStream_t side_stream, void* side_workspace)
    : main_{stream, workspace}, side_{side_stream, side_workspace}, algos_(std::make_unique<AlgoCache>()) {
  GPT_CHECK(workspace != nullptr);
  GPT_CHECK((side_stream == nullptr) == (side_workspace == nullptr) && side_workspace != workspace);
  if (side_stream != nullptr) {
    GPT_CUDA_CHECK(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
    GPT_CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
  }
  cublasLtHandle_t h = nullptr;
  GPT_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
  if (const char* path = std::getenv("GPT_GEMM_ALGO_CACHE"); path != nullptr) {
    Expected<AlgoFile> file = read_algo_file(path);  // make_cuda_backend read it first (check_gemm_algo_cache)
    GPT_CHECK_MSG(file.has_value(), file.status().message().c_str());
    log_info("GPT_GEMM_ALGO_CACHE: " + std::to_string(file->algos.size()) + " GEMM shapes' algorithms from " + path +
             (gemm_algos_to_time() > 1 ? "; shapes it lacks are timed (GPT_GEMM_ALGOS) and added" : ""));
    algos_->file = std::move(*file);
  }
}

Status check_gemm_algo_cache() {
  const char* path = std::getenv("GPT_GEMM_ALGO_CACHE");
  if (path == nullptr) return Status::ok();
  const Expected<AlgoFile> file = read_algo_file(path);
  if (!file.has_value()) return file.status();
  // A run that will time shapes writes the file now, so that one where it cannot stops before its timings are lost.
  if (gemm_algos_to_time() > 1 && file->algos.empty()) return write_algo_file(*file);
  return Status::ok();
}

Matmul::~Matmul() {
  if (handle_ != nullptr) cublasLtDestroy(lt(handle_));
  if (forked_ != nullptr) cudaEventDestroy(forked_);
  if (joined_ != nullptr) cudaEventDestroy(joined_);
}

const Matmul::Lane& Matmul::fork_gradients(bool with_dinp, bool with_dweight_or_dbias) {
  if (side_.stream == nullptr || !with_dinp || !with_dweight_or_dbias) return main_;
  // The side stream waits for everything queued on the main stream so far: the call's inputs, and the previous
  // reader of the scratch area its bias gradient uses.
  GPT_CUDA_CHECK(cudaEventRecord(forked_, main_.stream));
  GPT_CUDA_CHECK(cudaStreamWaitEvent(side_.stream, forked_, 0));
  return side_;
}

void Matmul::join_gradients(const Lane& lane) {
  if (&lane != &side_) return;
  GPT_CUDA_CHECK(cudaEventRecord(joined_, side_.stream));
  GPT_CUDA_CHECK(cudaStreamWaitEvent(main_.stream, joined_, 0));
}

// Column-major C(m,n) = op(A) op(B) + beta C [+ bias(m) broadcast over columns]; C fp32, or bf16 (beta 0, and a bias
// only through the epilogue: the bf16 result is rounded once, from the fp32 sum with the bias). act kGeluAux: C =
// GELU(sum) and aux (m, n; ld ldc, C's type) = the sum; kDGelu: C = GELU'(aux) * sum (aux read); both bf16 only.
// kDGeluBGrad: `bias` is an output (kernels.h); false then where cuBLASLt has no algorithm for it (nothing
// ran).
bool Matmul::gemm(const Lane& lane, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                  int64_t lda, const void* b, int64_t ldb, DType ab_type, void* c, DType c_type, int64_t ldc,
                  float beta, const void* bias, Act act, const void* aux) {
  const bool dgelu_bgrad = act == Act::kDGeluBGrad;  // then `bias` is the epilogue's output
  // The bias epilogue wants a 16-byte aligned vector; parameters sit at any float offset in their unit's flat
  // buffer, so an unaligned fp32 bias is added by a kernel after the GEMM instead.
  const bool bias_epilogue = !dgelu_bgrad && bias != nullptr && alignment(bias) >= 16;
  const bool c_bf16 = c_type == DType::kBF16;
  GPT_CHECK(!c_bf16 || (ab_type == DType::kBF16 && beta == 0.0f && (bias == nullptr || bias_epilogue || dgelu_bgrad)));
  GPT_CHECK(act == Act::kNone ||
            (c_bf16 && aux != nullptr && ldc % 8 == 0 && (act == Act::kGeluAux || dgelu_bgrad || !bias)));
  GPT_CHECK(!dgelu_bgrad || (bias != nullptr && alignment(bias) >= 16));
  // cuBLASLt assumes 256-byte aligned matrices unless told otherwise; ours are offsets into flat buffers. The
  // bias's and the GELU input's alignments it reads off the pointers the heuristic is given (cublasLt.h: routines
  // that do not dereference them "depend on its value to determine expected pointer alignment").
  const uint32_t align_a = alignment(a), align_b = alignment(b), align_c = alignment(c);
  const uint32_t align_bias = bias_epilogue || dgelu_bgrad ? alignment(bias) : 0;  // 0: no bias epilogue
  const uint32_t align_aux = aux != nullptr ? alignment(aux) : 0;
  // Every input of the heuristic: transposes, sizes, leading dimensions, input and output types, epilogue and
  // alignments.
  const int64_t ab_code = static_cast<int64_t>(ab_type);
  const std::array<int64_t, 16> key = {trans_a,    trans_b, m,       n,       k,
                                       lda,        ldb,     ldc,     ab_code, c_bf16,
                                       align_bias, align_a, align_b, align_c, static_cast<int64_t>(act),
                                       align_aux};
  auto it = algos_->plans.find(key);
  if (it == algos_->plans.end()) {
    AlgoCache::Plan p;
    const cudaDataType_t ab = ab_type == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
    GPT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    GPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    GPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtEpilogue_t epi = bias_epilogue ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (act == Act::kGeluAux) epi = bias_epilogue ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (act == Act::kDGelu) epi = CUBLASLT_EPILOGUE_DGELU;
    if (dgelu_bgrad) {  // into `bias` in fp32, where C is bf16 (cuBLASLt's default would be C's type)
      epi = CUBLASLT_EPILOGUE_DGELU_BGRAD;
      const cudaDataType_t bias_type = CUDA_R_32F;
      GPT_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
      GPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    }
    if (bias_epilogue || dgelu_bgrad) {
      GPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    // The GELU input: C's type (cuBLASLt's default), C's leading dimension.
    if (act == Act::kGeluAux || act == Act::kDGelu || dgelu_bgrad) {
      GPT_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
      GPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldc, sizeof(ldc)));
    }
    GPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, ab, trans_a ? k : m, trans_a ? m : k, lda));
    GPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, ab, trans_b ? n : k, trans_b ? k : n, ldb));
    // For a bf16 C the bias epilogue's vector is bf16 too (cuBLASLt's default: D's type).
    GPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, c_bf16 ? CUDA_R_16BF : CUDA_R_32F, m, n, ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    GPT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspaceBytes;
    GPT_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    GPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                          sizeof(align_a)));
    GPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                          sizeof(align_b)));
    GPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                          sizeof(align_c)));
    GPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                          sizeof(align_c)));
    // The heuristic costs tens of microseconds of host time: asked once per shape, which also keeps every call
    // of a shape on the same algorithm.
    const int asked = gemm_algos_to_time();
    std::array<cublasLtMatmulHeuristicResult_t, 16> results{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt(handle_), p.op, p.la, p.lb, p.lc, p.lc, pref, asked, results.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    const cublasLtMatmulHeuristicResult_t& heuristic = results[0];
    it = algos_->plans.emplace(key, p).first;  // owned by the cache from here, destroyed with it
    // An epilogue this cuBLASLt (or GPU) has no kernel for at this shape is the user's choice to undo.
    // The result's fields are valid only where its state is success (cublasLt.h).
    const bool usable = st == CUBLAS_STATUS_SUCCESS && found > 0 && heuristic.state == CUBLAS_STATUS_SUCCESS;
    if (dgelu_bgrad && !usable) {  // the caller sums the bias gradient itself; the plan remembers, so asked once
      it->second.usable = false;
      log_info(std::string("cuBLASLt has no DGELU_BGRAD algorithm for the GEMM m ") + std::to_string(m) + " n " +
               std::to_string(n) + " k " + std::to_string(k) + ": its bias gradient is summed by a kernel");
      return false;
    }
    GPT_CHECK_MSG(act == Act::kNone || usable,
                  "cuBLASLt has no algorithm for the GELU epilogue at this GEMM shape and alignment: run with "
                  "run.gelu_fusion: none");
    GPT_CUBLAS_CHECK(st);
    GPT_CHECK_MSG(usable, "cuBLASLt found no algorithm for a matmul shape");
    it->second.algo = heuristic.algo;
    std::optional<AlgoFile>& file = algos_->file;
    const bool in_file = file && file->algos.count(key) != 0;
    if (in_file) {
      const cublasLtMatmulAlgo_t& kept = file->algos.at(key);
      cublasLtMatmulHeuristicResult_t checked{};
      GPT_CHECK_MSG(cublasLtMatmulAlgoCheck(lt(handle_), p.op, p.la, p.lb, p.lc, p.lc, &kept, &checked) ==
                            CUBLAS_STATUS_SUCCESS &&
                        checked.workspaceSize <= kWorkspaceBytes,
                    ("GPT_GEMM_ALGO_CACHE " + file->path + ": cuBLASLt refuses its algorithm for the GEMM m " +
                     std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) +
                     " (delete the file to choose again)")
                        .c_str());
      it->second.algo = kept;
    }
    if (!in_file && asked > 1) {
      const AlgoCache::Plan& q = it->second;
      // On the side lane (GPT_GEMM_WGRAD_STREAM) the main stream's input-gradient GEMM, queued just before, would run
      // beside the timed calls: waited for first, so each candidate is timed alone (once per shape).
      if (&lane != &main_) GPT_CUDA_CHECK(cudaStreamSynchronize(main_.stream));
      // A weight gradient accumulates into c: saved before the timing, put back after it.
      void* saved = nullptr;
      const size_t c_bytes = static_cast<size_t>(ldc) * (n - 1) * (c_bf16 ? 2 : 4) + m * (c_bf16 ? 2 : 4);
      if (beta != 0.0f) {
        GPT_CUDA_CHECK(cudaMalloc(&saved, c_bytes));
        GPT_CUDA_CHECK(cudaMemcpyAsync(saved, c, c_bytes, cudaMemcpyDeviceToDevice, lane.stream));
      }
      auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        const float alpha = 1.0f;
        return cublasLtMatmul(lt(handle_), q.op, &alpha, a, q.la, b, q.lb, &beta, c, q.lc, c, q.lc, &algo,
                              lane.workspace, kWorkspaceBytes, lane.stream);
      };
      const std::string shape = "GEMM m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) +
                                (ab_type == DType::kBF16 ? " bf16" : " fp32") + (c_bf16 ? " -> bf16" : " -> fp32") +
                                (bias_epilogue ? " +bias" : "") + (beta != 0.0f ? " beta 1" : "") +
                                (act == Act::kGeluAux ? " +gelu"
                                 : act == Act::kDGelu ? " +dgelu"
                                 : dgelu_bgrad        ? " +dgelu +bgrad"
                                                      : "");
      it->second.algo = fastest_algo(results.data(), found, run, lane.stream, shape);
      if (file) {  // kept for the next runs; a file that cannot be written loses only that
        file->algos[key] = it->second.algo;
        if (const Status st = write_algo_file(*file); !st.is_ok()) log_warning(st.message());
      }
      if (saved != nullptr) {
        GPT_CUDA_CHECK(cudaMemcpyAsync(c, saved, c_bytes, cudaMemcpyDeviceToDevice, lane.stream));
        GPT_CUDA_CHECK(cudaStreamSynchronize(lane.stream));
        GPT_CUDA_CHECK(cudaFree(saved));
      }
    }
  } else {
    if (!it->second.usable) return false;
    if (bias_epilogue || dgelu_bgrad) {
      GPT_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(it->second.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (act == Act::kGeluAux || act == Act::kDGelu || dgelu_bgrad) {
      GPT_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(it->second.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    }
  }
  const AlgoCache::Plan& p = it->second;
  const float alpha = 1.0f;
  GPT_CUBLAS_CHECK(cublasLtMatmul(lt(handle_), p.op, &alpha, a, p.la, b, p.lb, &beta, c, p.lc, c, p.lc, &p.algo,
                                  lane.workspace, kWorkspaceBytes, lane.stream));
  if (bias != nullptr && !bias_epilogue && !dgelu_bgrad) {
    add_bias_kernel<<<grid_for(m * n, 256), 256, 0, lane.stream>>>(static_cast<float*>(c),
                                                                   static_cast<const float*>(bias), m, n, ldc);
    GPT_CUDA_CHECK_LAUNCH();
  }
  return true;
}

void Matmul::forward(void* out, DType out_type, const void* inp, const void* weight, DType type, const void* bias,
                     int64_t N, int C, int OC, int64_t ld) {
  GPT_CHECK(N > 0 && C > 0 && OC > 0 && ld >= OC);
  gemm(main_, true, false, OC, N, C, weight, C, inp, C, type, out, out_type, ld, 0.0f, bias);
}

void Matmul::backward(TensorPtr dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                      const void* weight, DType type, int64_t N, int C, int OC, int64_t ld, void* scratch) {
  GPT_CHECK(N > 0 && C > 0 && OC > 0 && ld >= OC);
  const Lane& grads = fork_gradients(dinp.data != nullptr, dweight != nullptr || dbias != nullptr);
  if (dinp.data != nullptr) {
    gemm(main_, false, false, C, N, OC, weight, C, dout, ld, type, dinp.data, dinp.dtype, C, 0.0f, nullptr);
  }
  dweight_dbias(grads, dweight, dbias, dout, inp, type, N, C, OC, ld, scratch);
  join_gradients(grads);
}

void Matmul::forward_gelu(bf16* out, bf16* pre, const bf16* inp, const bf16* weight, const bf16* bias, int64_t N, int C,
                          int OC) {
  GPT_CHECK(N > 0 && C > 0 && OC > 0 && gelu_fusable(OC));
  gemm(main_, true, false, OC, N, C, weight, C, inp, C, DType::kBF16, out, DType::kBF16, OC, 0.0f, bias, Act::kGeluAux,
       pre);
}

size_t Matmul::backward_dgelu_scratch_bytes(int64_t N, int C, int OC) {
  return cuda_workspace::matmul_backward_dgelu(N, C, OC);
}

bool Matmul::backward_dgelu(bf16* dpre, const bf16* pre, float* dpre_bias, float* dweight, float* dbias,
                            const bf16* dout, const bf16* inp, const bf16* weight, int64_t N, int C, int OC,
                            void* scratch) {
  GPT_CHECK(N > 0 && C > 0 && OC > 0 && gelu_fusable(C));
  const Lane& grads = fork_gradients(true, dweight != nullptr || dbias != nullptr);
  bool summed = false;
  if (dpre_bias != nullptr && scratch != nullptr && dgelu_bgrad_enabled()) {
    // Past dbias's partials (which the weight-gradient lane may be writing meanwhile).
    auto* sums = reinterpret_cast<float*>(static_cast<char*>(scratch) +
                                          cuda_workspace::align_up(bias_backward_scratch_bytes(N, OC)));
    summed = gemm(main_, false, false, C, N, OC, weight, C, dout, OC, DType::kBF16, dpre, DType::kBF16, C, 0.0f, sums,
                  Act::kDGeluBGrad, pre);
    if (summed) {
      bias_sum_kernel<<<static_cast<unsigned>(ceil_div(C, kWarp)), kWarp, 0, main_.stream>>>(dpre_bias, sums, 1, C);
      GPT_CUDA_CHECK_LAUNCH();
    }
  }
  if (!summed) {
    gemm(main_, false, false, C, N, OC, weight, C, dout, OC, DType::kBF16, dpre, DType::kBF16, C, 0.0f, nullptr,
         Act::kDGelu, pre);
  }
  dweight_dbias(grads, dweight, dbias, dout, inp, DType::kBF16, N, C, OC, OC, scratch);
  join_gradients(grads);
  return summed;
}

void Matmul::dweight_dbias(const Lane& lane, float* dweight, float* dbias, const void* dout, const void* inp,
                           DType type, int64_t N, int C, int OC, int64_t ld, void* scratch) {
  // dweight^T(C, OC) += inp^T(C, N) dout(N, OC).
  if (dweight != nullptr) {
    gemm(lane, false, true, C, OC, N, inp, C, dout, ld, type, dweight, DType::kF32, C, 1.0f, nullptr);
  }
  if (dbias != nullptr) bias_backward(dbias, ConstTensorPtr(dout, type), N, OC, ld, scratch, lane.stream);
}

size_t bias_backward_scratch_bytes(int64_t N, int OC) { return cuda_workspace::matmul_backward(N, OC); }

void bias_backward(float* dbias, ConstTensorPtr dout, int64_t N, int OC, int64_t ld, void* scratch,
                   cudaStream_t stream) {
  GPT_CHECK(N > 0 && OC > 0 && ld >= OC && dbias != nullptr && dout.data != nullptr && scratch != nullptr);
  auto* partial = static_cast<float*>(scratch);
  const dim3 grid = column_partials_grid(N, OC);
  with_dtype(dout, [&](auto* d) {
    using In = element_t<decltype(d)>;
    const bool vec = aligned4(d) && ld % 4 == 0;
    bias_partial_kernel<In><<<grid, dim3(kWarp, kDbiasRowThreads), 0, stream>>>(partial, d, N, OC, ld, vec);
  });
  GPT_CUDA_CHECK_LAUNCH();
  bias_backward_sum(dbias, partial, N, OC, stream);
}

void bias_backward_sum(float* dbias, const float* partial, int64_t N, int OC, cudaStream_t stream) {
  const int64_t chunks = ceil_div(N, cuda_workspace::kDbiasRows);
  bias_sum_kernel<<<static_cast<unsigned>(ceil_div(OC, kWarp)), kWarp, 0, stream>>>(dbias, partial, chunks, OC);
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::cuda
