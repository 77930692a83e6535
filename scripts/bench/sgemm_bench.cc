// sgemm_bench: the GFLOP/s of the GEMM gpt-train's CPU backend uses (oneDNN's dnnl_sgemm, row-major), on the
// shapes one GPT-2 block issues, so that the benchmark can report training throughput as a fraction of what
// the GEMM itself reaches on this machine.
//
//   sgemm_bench [--threads N] [--rows M --width C]
//
// With --rows/--width: the 12 GEMMs of one block with M = B*T rows and width C (qkv, attention projection,
// MLP fc, MLP projection; each as forward 'N','T', input-gradient 'N','N' and weight-gradient 'T','N', as in
// kernels/cpu/matmul.cc). Without: the shapes of both benchmark configs (M=768, C=128 and M=2048, C=384).
// Prints one line per shape, then "sgemm_gflops <median over shapes>" last.
#include <dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

namespace {

struct Shape {
  char ta, tb;
  int64_t m, n, k;
  std::string name;
};

// out(M,OC) = inp(M,IC) @ W(OC,IC)^T; dinp(M,IC) = dout(M,OC) @ W(OC,IC); dW(OC,IC) += dout^T @ inp.
void add_linear(std::vector<Shape>& shapes, const std::string& name, int64_t rows, int64_t ic, int64_t oc) {
  shapes.push_back({'N', 'T', rows, oc, ic, name + ".fwd"});
  shapes.push_back({'N', 'N', rows, ic, oc, name + ".dinp"});
  shapes.push_back({'T', 'N', oc, ic, rows, name + ".dw"});
}

void add_block(std::vector<Shape>& shapes, int64_t rows, int64_t c) {
  char tag[32];  // snprintf, not string concatenation: GCC 12 warns falsely (-Wrestrict) on the latter
  std::snprintf(tag, sizeof tag, "M%lldC%lld.", static_cast<long long>(rows), static_cast<long long>(c));
  add_linear(shapes, std::string(tag) + "qkv", rows, c, 3 * c);
  add_linear(shapes, std::string(tag) + "attn_proj", rows, c, c);
  add_linear(shapes, std::string(tag) + "fc", rows, c, 4 * c);
  add_linear(shapes, std::string(tag) + "mlp_proj", rows, 4 * c, c);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// GFLOP/s of one shape: the median of 5 timed batches, each at least ~30 ms, after a warm-up.
double bench(const Shape& s) {
  // Row-major: A is (M,K) stored as given by ta, B is (K,N) stored as given by tb.
  const int64_t lda = s.ta == 'N' ? s.k : s.m;
  const int64_t ldb = s.tb == 'N' ? s.n : s.k;
  std::vector<float> a(s.m * s.k), b(s.k * s.n), c(s.m * s.n, 0.0f);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  auto run = [&] {
    if (dnnl_sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n) !=
        dnnl_success) {
      std::fprintf(stderr, "dnnl_sgemm failed on %s\n", s.name.c_str());
      std::exit(1);
    }
  };
  const double flops = 2.0 * s.m * s.n * s.k;
  int reps = 1;
  for (double t0 = now_s(); now_s() - t0 < 0.03;) run();  // warm-up (JIT, caches, thread pool)
  for (;;) {  // calibrate the batch length
    const double t0 = now_s();
    for (int i = 0; i < reps; ++i) run();
    if (now_s() - t0 > 0.03) break;
    reps *= 2;
  }
  std::vector<double> rates;
  for (int batch = 0; batch < 5; ++batch) {
    const double t0 = now_s();
    for (int i = 0; i < reps; ++i) run();
    rates.push_back(flops * reps / (now_s() - t0) / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

int arg_int(int argc, char** argv, const char* flag, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("usage: sgemm_bench [--threads N] [--rows M --width C]\n");
      return 0;
    }
  const int threads = arg_int(argc, argv, "--threads", 2);
  const int rows = arg_int(argc, argv, "--rows", 0), width = arg_int(argc, argv, "--width", 0);
  omp_set_num_threads(threads);

  std::vector<Shape> shapes;
  if (rows > 0 && width > 0) {
    add_block(shapes, rows, width);
  } else {
    add_block(shapes, 768, 128);
    add_block(shapes, 2048, 384);
  }

  std::printf("dnnl_sgemm, %d threads\n", threads);
  std::vector<double> rates;
  for (const Shape& s : shapes) {
    const double g = bench(s);
    rates.push_back(g);
    std::printf("  %-24s %c%c M=%-5lld N=%-5lld K=%-5lld %8.1f GFLOP/s\n", s.name.c_str(), s.ta, s.tb,
                static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k), g);
  }
  std::sort(rates.begin(), rates.end());
  const size_t n = rates.size();
  const double median = n % 2 ? rates[n / 2] : 0.5 * (rates[n / 2 - 1] + rates[n / 2]);
  std::printf("sgemm_gflops %.1f\n", median);
  return 0;
}
