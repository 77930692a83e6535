// Linear layers through oneDNN's sgemm (chosen by measurement over OpenBLAS and BLIS: it dispatches its
// JIT kernels on the CPU's ISA at run time, so it is fast without OPENBLAS_CORETYPE-style settings).
// Row-major throughout: out(N,OC) = inp(N,C) @ W(OC,C)^T + b.
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/kernels.h"

namespace gpt::cpu {

static void sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                  int64_t ldb, float beta, float* C, int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  GPT_CHECK_MSG(st == dnnl_success, "dnnl_sgemm failed");
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C, int OC,
                    int64_t ld) {
  GPT_CHECK(ld >= OC);
  float beta = 0.0f;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) std::copy(bias, bias + OC, out + i * ld);
    beta = 1.0f;
  }
  sgemm('N', 'T', N, OC, C, inp, C, weight, C, beta, out, ld);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int C, int OC, int64_t ld) {
  GPT_CHECK(ld >= OC);
  if (dinp != nullptr) sgemm('N', 'N', N, C, OC, dout, ld, weight, C, 0.0f, dinp, C);
  if (dweight != nullptr) sgemm('T', 'N', OC, C, N, dout, ld, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) bias_backward(dbias, dout, N, OC, ld);
}

void bias_backward(float* dbias, const float* dout, int64_t N, int OC, int64_t ld) {
  GPT_CHECK(ld >= OC);
  // Column sums: each thread owns a slice of columns and walks the rows in order (deterministic).
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int chunk = (OC + nt - 1) / nt;
    const int lo = std::min(OC, tid * chunk), hi = std::min(OC, lo + chunk);
    if (lo < hi) {
      thread_local std::vector<float> acc;  // grows once, then reused: no allocation in the step loop
      acc.assign(hi - lo, 0.0f);
      for (int64_t i = 0; i < N; ++i) {
        const float* row = dout + i * ld;
#pragma omp simd
        for (int o = lo; o < hi; ++o) acc[o - lo] += row[o];
      }
      for (int o = lo; o < hi; ++o) dbias[o] += acc[o - lo];
    }
  }
}

}  // namespace gpt::cpu
