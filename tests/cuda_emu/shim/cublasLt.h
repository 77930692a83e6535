// Emulated cuBLASLt: just what matmul.cu calls. cublasLtMatmul computes D = alpha op(A) op(B) + beta C
// (+ bias over D's rows with the BIAS epilogue) on the host, column-major as cuBLASLt, accumulating in double,
// with fp32 or bf16 A/B and fp32 C/D, or bf16 C/D (bf16 A/B, beta 0) with a bf16 bias (cuBLASLt's bias type
// defaults to D's), the result rounded once to nearest even. It checks what cuBLASLt would reject (leading dimensions,
// C == D) and the alignment promises matmul.cu makes through the MIN_ALIGNMENT preferences, so the emulated test checks
// matmul.cu's row-major <-> column-major mapping, its transposes, leading dimensions and bias handling. The GELU
// epilogues (GELU_AUX, GELU_AUX_BIAS: D = GELU(sum), aux = the sum; DGELU: D = GELU'(aux) * sum), bf16 D and aux,
// check the aux pointer and leading dimension as cuBLASLt documents them (ld >= rows, a multiple of 8; aligned
// as the pointer given to the heuristic was). DGELU_BGRAD: DGELU, and the bias pointer an output, fp32, m elements:
// D's row sums (before its rounding), in double here; with emu_lt_no_dgelu_bgrad set (tests) the heuristic finds no
// algorithm for it, as a real cuBLASLt may at some shapes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_runtime.h"
typedef int cublasStatus_t;
constexpr int CUBLAS_STATUS_SUCCESS = 0;
enum cublasOperation_t { CUBLAS_OP_N, CUBLAS_OP_T };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F };
enum cudaDataType_t { CUDA_R_32F, CUDA_R_16BF };
enum cublasLtEpilogue_t {
  CUBLASLT_EPILOGUE_DEFAULT,
  CUBLASLT_EPILOGUE_BIAS,
  CUBLASLT_EPILOGUE_GELU_AUX,
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
  CUBLASLT_EPILOGUE_DGELU,
  CUBLASLT_EPILOGUE_DGELU_BGRAD
};
inline bool emu_lt_no_dgelu_bgrad = false;  // tests: the heuristic has no DGELU_BGRAD algorithm
enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_TRANSA,
  CUBLASLT_MATMUL_DESC_TRANSB,
  CUBLASLT_MATMUL_DESC_EPILOGUE,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
};
enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES
};
struct EmuLtHandle {};
struct EmuLtDesc {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;  // the GELU input: written by GELU_AUX(_BIAS), read by DGELU; D's type
  int64_t aux_ld = 0;
  int bias_type = -1;  // BIAS_DATA_TYPE: -1, D's type (cuBLASLt's default)
};
struct EmuLtLayout {
  cudaDataType_t type;
  int64_t rows, cols, ld;
};
struct EmuLtPref {
  size_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's default assumption
};
typedef EmuLtHandle* cublasLtHandle_t;
typedef EmuLtDesc* cublasLtMatmulDesc_t;
typedef EmuLtLayout* cublasLtMatrixLayout_t;
typedef EmuLtPref* cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t {
  uint32_t align[6];
};  // the alignments the heuristic was promised (A, B, C, D) or, for the GELU input and the bias, read off their pointers
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize = 0;
  int state = 0;  // CUBLAS_STATUS_SUCCESS
  float wavesCount = 1.0f;
};
// The algorithm configuration matmul.cu's GPU experiment reads (GPT_GEMM_ALGOS): reads fail, so the logs say "?" and the heuristic's algorithm stays; the check accepts an algorithm as it is (one
// GPT_GEMM_ALGO_CACHE kept: cublasLtMatmul still checks the matrices against the alignments it carries).
enum cublasLtMatmulAlgoConfigAttributes_t {
  CUBLASLT_ALGO_CONFIG_ID,
  CUBLASLT_ALGO_CONFIG_TILE_ID,
  CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
  CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
  CUBLASLT_ALGO_CONFIG_STAGES_ID = 6,
  CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID = 8
};
constexpr int CUBLAS_STATUS_NOT_SUPPORTED = 15;
inline int cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t*, cublasLtMatmulAlgoConfigAttributes_t,
                                                void*, size_t, size_t*) {
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
inline int cublasLtMatmulAlgoCheck(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                   cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                   const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* r) {
  if (algo->align[0] == 0) return CUBLAS_STATUS_NOT_SUPPORTED;  // no algorithm the heuristic gives (tests make it)
  r->algo = *algo;
  r->workspaceSize = 0;
  r->state = 0;
  return 0;
}
inline size_t cublasLtGetVersion() { return 1; }  // the emulator's
inline const char* cublasLtGetStatusString(int) { return "emu"; }
inline int cublasLtCreate(cublasLtHandle_t* h) {
  *h = new EmuLtHandle;
  return 0;
}
inline int cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return 0;
}
inline int cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t, cudaDataType_t scale) {
  if (scale != CUDA_R_32F) emu_fail("cublasLt: scale type must be fp32");
  *d = new EmuLtDesc;
  return 0;
}
inline int cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return 0;
}
// An attribute's value of exactly the field's size into the field.
template <class T>
inline void emu_lt_set(T& field, const void* v, size_t n) {
  if (n != sizeof(field)) emu_fail("cublasLt: attribute size");
  std::memcpy(&field, v, n);
}
inline int cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* v,
                                          size_t n) {
  switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      emu_lt_set(d->ta, v, n);
      break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      emu_lt_set(d->tb, v, n);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      emu_lt_set(d->epi, v, n);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      emu_lt_set(d->bias, v, n);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      emu_lt_set(d->aux, v, n);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      emu_lt_set(d->aux_ld, v, n);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: {
      cudaDataType_t t;
      emu_lt_set(t, v, n);
      d->bias_type = t;
      break;
    }
  }
  return 0;
}
inline int cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t t, uint64_t rows, uint64_t cols,
                                      int64_t ld) {
  if (ld < static_cast<int64_t>(rows) || ld < 1) emu_fail("cublasLt: leading dimension smaller than the rows");
  *l = new EmuLtLayout{t, static_cast<int64_t>(rows), static_cast<int64_t>(cols), ld};
  return 0;
}
inline int cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return 0;
}
inline int cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new EmuLtPref;
  return 0;
}
inline int cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return 0;
}
inline int cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                                                const void* v, size_t n) {
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (n != sizeof(size_t)) emu_fail("cublasLt: attribute size");
    std::memcpy(&p->workspace, v, n);
  } else {
    if (n != sizeof(uint32_t)) emu_fail("cublasLt: attribute size");
    std::memcpy(&p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], v, n);
  }
  return 0;
}
// The largest power of two up to 256 dividing p's address (cuBLASLt takes the GELU input's from its pointer).
inline uint32_t emu_lt_alignment(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}
inline bool emu_lt_has_bias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
inline bool emu_lt_gelu(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU ||
         e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
// The heuristic remembers the promised alignments in the algo (as the real algo is only valid for them), and
// cublasLtMatmul checks the matrices against the algo it is given.
inline int cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t,
                                          cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                          cublasLtMatmulPreference_t p, int, cublasLtMatmulHeuristicResult_t* r,
                                          int* found) {
  std::memcpy(r->algo.align, p->align, sizeof p->align);
  r->algo.align[4] = emu_lt_gelu(d->epi) ? emu_lt_alignment(d->aux) : 1;
  r->algo.align[5] = emu_lt_has_bias(d->epi) ? emu_lt_alignment(d->bias) : 1;
  r->state = 0;
  *found = 1;
  if (d->epi == CUBLASLT_EPILOGUE_DGELU_BGRAD && emu_lt_no_dgelu_bgrad) *found = 0;  // NOT_SUPPORTED's way too
  return 0;
}
inline float emu_lt_load(const void* p, cudaDataType_t t, int64_t i) {
  return t == CUDA_R_32F ? static_cast<const float*>(p)[i] : __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
inline void emu_lt_compute(const EmuLtDesc* d, const EmuLtLayout* la, const EmuLtLayout* lb, const EmuLtLayout* ld,
                           const void* a, const void* b, void* dd, float al, float be, bool d_bf16, int64_t m,
                           int64_t n, int64_t k);
inline int cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void* alpha, const void* a,
                          cublasLtMatrixLayout_t la, const void* b, cublasLtMatrixLayout_t lb, const void* beta,
                          const void* c, cublasLtMatrixLayout_t lc, void* dd, cublasLtMatrixLayout_t ld,
                          const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (algo == nullptr) emu_fail("cublasLt: no algo (matmul.cu always passes the heuristic's)");
  if (c != dd || lc->ld != ld->ld || lc->rows != ld->rows || lc->cols != ld->cols)
    emu_fail("cublasLt: emulated only for C == D");
  if (la->type != lb->type) emu_fail("cublasLt: unsupported types");
  const bool d_bf16 = lc->type == CUDA_R_16BF;
  if (d_bf16 && la->type != CUDA_R_16BF) emu_fail("cublasLt: a bf16 D needs bf16 A and B here");
  if (workspace_bytes > 0 && workspace == nullptr) emu_fail("cublasLt: null workspace");
  const void* ptrs[4] = {a, b, c, dd};
  for (int i = 0; i < 4; ++i)
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % algo->align[i] != 0)
      emu_fail("cublasLt: matrix less aligned than promised");
  const int64_t m = ld->rows, n = ld->cols;
  const int64_t k = d->ta == CUBLAS_OP_N ? la->cols : la->rows;
  if ((d->ta == CUBLAS_OP_N ? la->rows : la->cols) != m || (d->tb == CUBLAS_OP_N ? lb->rows : lb->cols) != k ||
      (d->tb == CUBLAS_OP_N ? lb->cols : lb->rows) != n)
    emu_fail("cublasLt: inconsistent shapes");
  if (emu_lt_has_bias(d->epi) && (d->bias == nullptr || reinterpret_cast<uintptr_t>(d->bias) % 16 != 0))
    emu_fail("cublasLt: bias epilogue needs a 16-byte aligned bias");
  if (emu_lt_has_bias(d->epi) && reinterpret_cast<uintptr_t>(d->bias) % algo->align[5] != 0)
    emu_fail("cublasLt: bias less aligned than at the heuristic");
  if (emu_lt_gelu(d->epi)) {  // the GELU input: C's shape, an ld of a multiple of 8, bf16 here
    if (d->aux == nullptr) emu_fail("cublasLt: a GELU epilogue without EPILOGUE_AUX_POINTER");
    if (d->aux_ld < ld->rows || d->aux_ld % 8 != 0) emu_fail("cublasLt: EPILOGUE_AUX_LD below the rows or not a multiple of 8");
    if (!d_bf16) emu_fail("cublasLt: the GELU epilogues are emulated for a bf16 D only");
    if (reinterpret_cast<uintptr_t>(d->aux) % algo->align[4] != 0) emu_fail("cublasLt: GELU input less aligned than at the heuristic");
    if (!emu_is_device(d->aux, (d->aux_ld * (n - 1) + m) * 2)) emu_fail("cublasLt: the GELU input is not device memory");
  }
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);  // host scalars: now
  if (d_bf16 && be != 0.0f) emu_fail("cublasLt: emulated bf16 D only with beta 0");
  if (d->epi == CUBLASLT_EPILOGUE_DGELU_BGRAD && d->bias_type != CUDA_R_32F)
    emu_fail("cublasLt: DGELU_BGRAD is emulated with an fp32 bias gradient (BIAS_DATA_TYPE) only");
  // The product when the stream gets to it, from the descriptors as they are now (the caller may reuse them).
  emu_enqueue(stream, [dv = *d, lav = *la, lbv = *lb, ldv = *ld, a, b, dd, al, be, d_bf16, m, n, k] {
    emu_lt_compute(&dv, &lav, &lbv, &ldv, a, b, dd, al, be, d_bf16, m, n, k);
  });
  return 0;
}
inline void emu_lt_compute(const EmuLtDesc* d, const EmuLtLayout* la,
                           const EmuLtLayout* lb, const EmuLtLayout* ld, const void* a,
                           const void* b, void* dd, float al, float be, bool d_bf16, int64_t m, int64_t n, int64_t k) {
  const EmuLtLayout* lc = ld;  // C == D
  std::vector<double> row_sums(d->epi == CUBLASLT_EPILOGUE_DGELU_BGRAD ? static_cast<size_t>(m) : 0, 0.0);
  float* out = static_cast<float*>(dd);
  __nv_bfloat16* out_h = static_cast<__nv_bfloat16*>(dd);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const float x = emu_lt_load(a, la->type, d->ta == CUBLAS_OP_N ? i + p * la->ld : p + i * la->ld);
        const float y = emu_lt_load(b, lb->type, d->tb == CUBLAS_OP_N ? p + j * lb->ld : j + p * lb->ld);
        s += static_cast<double>(x) * y;
      }
      double r = al * s;
      if (be != 0.0f) r += static_cast<double>(be) * out[i + j * ld->ld];
      if (emu_lt_has_bias(d->epi) && d->epi != CUBLASLT_EPILOGUE_DGELU_BGRAD)
        r += emu_lt_load(d->bias, lc->type, i);  // the bias has D's type
      // GELU, tanh form, on the fp32 sum (in double here: an implementation other than gelu.cu's)
      const double kS = 0.7978845608028654, kA = 0.044715;
      if (d->epi == CUBLASLT_EPILOGUE_GELU_AUX || d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        const float x = static_cast<float>(r);
        static_cast<__nv_bfloat16*>(const_cast<void*>(d->aux))[i + j * d->aux_ld] = __float2bfloat16(x);
        r = 0.5 * x * (1.0 + std::tanh(kS * (x + kA * x * x * x)));
      } else if (d->epi == CUBLASLT_EPILOGUE_DGELU || d->epi == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
        const double x = __bfloat162float(static_cast<const __nv_bfloat16*>(d->aux)[i + j * d->aux_ld]);
        const double t = std::tanh(kS * (x + kA * x * x * x));
        r = static_cast<float>(r) * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kS * (1.0 + 3.0 * kA * x * x));
        if (!row_sums.empty()) row_sums[i] += static_cast<float>(r);
      }
      if (d_bf16) {
        out_h[i + j * ld->ld] = __float2bfloat16(static_cast<float>(r));
      } else {
        out[i + j * ld->ld] = static_cast<float>(r);
      }
    }
  if (d->epi == CUBLASLT_EPILOGUE_DGELU_BGRAD) {  // D's row sums (the fp32 values before D's rounding), overwriting
    for (int64_t i = 0; i < m; ++i) static_cast<float*>(const_cast<void*>(d->bias))[i] = static_cast<float>(row_sums[i]);
  }
}
