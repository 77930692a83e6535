// attention_bench: the time of the backend's fused causal attention at one GPT shape, forward and backward, for
// each attention kernel choice (run.attention_kernel), with TFLOP/s, and a correctness column: each kernel's output
// and input gradient against the CPU backend's fp32 attention on the same inputs (the first sequence of the batch;
// sequences are independent). scripts/bench/attention_vs_pytorch.sh runs it beside PyTorch's SDPA.
//
//   attention_bench [--device cuda|cpu] [--dtype bf16|fp32] [--kernels auto,wmma] [--batch 16] [--seq 1024]
//                   [--embd 768] [--heads 12] [--dropout 0] [--iters 20] [--warmup 3]
//
// Times: wall time of `iters` back-to-back calls after `warmup` ones, between two synchronize()s, divided by iters
// (the calls queue on one stream, so this is device time once a call is longer than its launches). backward is the
// whole op as the model calls it (on the mma path: the prep kernel for D, then dK/dV, then dQ; dO in bf16).
// FLOPs as FlashAttention's benchmarks count them: forward 4·B·NH·T²·hs / 2 (causal), backward 2.5 times that.
// One line per kernel, "attention_bench kernel=... fwd_ms=... bwd_ms=... fwd_tflops=... bwd_tflops=...
// out_err=... dqkv_err=... wrong=0|1" (errors: relative l2, ‖x − ref‖ / ‖ref‖; wrong when over 2e-2 for bf16, the
// parity tests' bound, or 1e-4 for fp32). Exit status 1 when any kernel is wrong, 2 on bad arguments.
// GPT_TRAIN_FAULT=attention_bench_wrong: spoils one output element before the comparison (the smoke test's check).
#include "attention_bench.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "core/test_fault.h"

namespace gpt {
namespace {

struct Args {
  std::string device = "cuda", dtype = "bf16", kernels;
  int batch = 16, seq = 1024, embd = 768, heads = 12, iters = 20, warmup = 3;
  float dropout = 0.0f;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// ‖x − ref‖ / ‖ref‖ over the first n elements.
double rel_l2(const std::vector<float>& x, const std::vector<float>& ref, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

// A backend buffer of n elements of `dtype` holding `host` (rounded to bf16 when dtype is bf16).
Buffer upload(Backend& be, const std::vector<float>& host, DType dtype) {
  Buffer buf = be.alloc(host.size() * dtype_size(dtype), MemCategory::kActivations);
  if (dtype == DType::kBF16) {
    std::vector<bf16> lo(host.size());
    for (size_t i = 0; i < host.size(); ++i) lo[i] = f32_to_bf16(host[i]);
    be.to_device(buf.data(), lo.data(), lo.size() * sizeof(bf16));
  } else {
    be.to_device(buf.data(), host.data(), host.size() * sizeof(float));
  }
  return buf;
}

// The first n elements of a backend buffer of `dtype`, as fp32.
std::vector<float> download(Backend& be, const Buffer& buf, DType dtype, size_t n) {
  std::vector<float> out(n);
  if (dtype == DType::kBF16) {
    std::vector<bf16> lo(n);
    be.to_host(lo.data(), buf.data(), n * sizeof(bf16));
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(lo[i]);
  } else {
    be.to_host(out.data(), buf.data(), n * sizeof(float));
  }
  return out;
}

template <typename F>
double ms_per_call(Backend& be, int warmup, int iters, F&& call) {
  for (int i = 0; i < warmup; ++i) call();
  be.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call();
  be.synchronize();
  const std::chrono::duration<double, std::milli> dt = std::chrono::steady_clock::now() - t0;
  return dt.count() / iters;
}

int run(const Args& a, const BackendFactory& make_device) {
  if (a.batch < 1 || a.seq < 1 || a.heads < 1 || a.embd < 1 || a.embd % a.heads != 0 || a.iters < 1 || a.warmup < 0 ||
      !(a.dropout >= 0.0f && a.dropout < 1.0f)) {
    std::fprintf(stderr,
                 "attention_bench: expected batch, seq, heads, iters >= 1, warmup >= 0, embd a multiple of heads and "
                 "0 <= dropout < 1\n");
    return 2;
  }
  if (a.dtype != "bf16" && a.dtype != "fp32") {
    std::fprintf(stderr, "attention_bench: --dtype: expected bf16 or fp32, got '%s'\n", a.dtype.c_str());
    return 2;
  }
  const DType dtype = a.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  Expected<std::unique_ptr<Backend>> made = make_device(a.device);
  if (!made.has_value()) {
    std::fprintf(stderr, "attention_bench: %s\n", made.status().message().c_str());
    return 2;
  }
  Backend& be = **made;
  be.set_compute_dtype(dtype);
  const int B = a.batch, T = a.seq, C = a.embd, NH = a.heads, hs = C / NH;
  const bool tensor_cores = a.device == "cuda" && dtype == DType::kBF16;
  if (tensor_cores && hs != 32 && hs != 64 && hs != 128) {
    // The CUDA backend would run its fp32 kernels under every kernel name: the rows would be mislabelled.
    std::fprintf(stderr,
                 "attention_bench: head size %d: the tensor-core kernels take 32, 64 or 128 (other head sizes run "
                 "the fp32 kernels: --dtype fp32)\n",
                 hs);
    return 2;
  }
  const std::vector<std::string> kernels =
      split_list(a.kernels.empty() ? (tensor_cores ? "auto,wmma" : "auto") : a.kernels);
  if (kernels.empty()) {
    std::fprintf(stderr, "attention_bench: --kernels: expected a comma-separated list of auto|wmma, got '%s'\n",
                 a.kernels.c_str());
    return 2;
  }

  std::printf("attention_bench device=%s dtype=%s B=%d T=%d C=%d NH=%d hs=%d dropout=%g iters=%d\n", a.device.c_str(),
              a.dtype.c_str(), B, T, C, NH, hs, a.dropout, a.iters);
  const size_t n_qkv = static_cast<size_t>(B) * T * 3 * C, n_out = static_cast<size_t>(B) * T * C;
  std::mt19937 gen(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(n_qkv), dout(n_out);
  for (float& x : qkv) x = normal(gen);
  for (float& x : dout) x = normal(gen);
  // What the kernels read: bf16 qkv and output gradient (the model's under bf16 compute: the projection GEMM's bf16
  // input gradient) are the rounded ones; the CPU reference reads the same values.
  if (dtype == DType::kBF16) {
    for (float& x : qkv) x = bf16_to_f32(f32_to_bf16(x));
    for (float& x : dout) x = bf16_to_f32(f32_to_bf16(x));
  }
  DropoutMask drop;
  drop.p = a.dropout;
  drop.rng = CounterRng{20261203, 7};

  Buffer d_qkv = upload(be, qkv, dtype), d_dout = upload(be, dout, dtype);
  Buffer d_out = be.alloc(n_out * dtype_size(dtype), MemCategory::kActivations);
  Buffer d_dqkv = be.alloc(n_qkv * dtype_size(dtype), MemCategory::kActivations);
  Buffer d_att = be.alloc(be.attention_state_floats(B, T, NH) * sizeof(float), MemCategory::kActivations);
  const TensorPtr out(d_out.data(), dtype), dqkv(d_dqkv.data(), dtype);
  const ConstTensorPtr in(d_qkv.data(), dtype);
  float* att = d_att.as<float>();
  const ConstTensorPtr g(d_dout.data(), dtype);

  // The reference: the CPU backend in fp32 on sequence 0 (the first T·3C inputs, T·C outputs).
  std::unique_ptr<Backend> cpu = std::move(*make_backend("cpu", 0, 1));
  cpu->set_compute_dtype(DType::kF32);
  std::vector<float> ref_out(static_cast<size_t>(T) * C), ref_dqkv(static_cast<size_t>(T) * 3 * C);
  std::vector<float> ref_att(cpu->attention_state_floats(1, T, NH));
  cpu->attention_forward(ref_out.data(), ref_att.data(), qkv.data(), 1, T, C, NH, drop);
  cpu->attention_backward(ref_dqkv.data(), dout.data(), qkv.data(), ref_out.data(), ref_att.data(), 1, T, C, NH, drop,
                          nullptr);

  const double fwd_flops = 4.0 * B * NH * static_cast<double>(T) * T * hs / 2.0, bwd_flops = 2.5 * fwd_flops;
  const double bound = dtype == DType::kBF16 ? 2e-2 : 1e-4;
  bool wrong_any = false;
  const std::optional<TestFault> fault = test_fault();
  const bool perturb = fault && fault->is("attention_bench_wrong", 0);
  for (const std::string& name : kernels) {
    Expected<AttentionKernel> kernel = parse_attention_kernel(name);
    if (!kernel.has_value()) {
      std::fprintf(stderr, "attention_bench: --kernels: %s\n", kernel.status().message().c_str());
      return 2;
    }
    if (Status st = be.set_attention_kernel(*kernel); !st.is_ok()) {
      std::fprintf(stderr, "attention_bench: kernel %s: %s\n", name.c_str(), st.message().c_str());
      return 2;
    }
    const double fwd_ms =
        ms_per_call(be, a.warmup, a.iters, [&] { be.attention_forward(out, att, in, B, T, C, NH, drop); });
    const double bwd_ms = ms_per_call(be, a.warmup, a.iters, [&] {
      be.attention_backward(dqkv, g, in, ConstTensorPtr(out), att, B, T, C, NH, drop, nullptr);
    });
    std::vector<float> got_out = download(be, d_out, dtype, ref_out.size());
    if (perturb) got_out[0] += 1.0f + std::fabs(ref_out[0]) * 4.0f;  // the tests' check that `wrong` can fire
    const double out_err = rel_l2(got_out, ref_out, ref_out.size());
    const double dqkv_err = rel_l2(download(be, d_dqkv, dtype, ref_dqkv.size()), ref_dqkv, ref_dqkv.size());
    // NaN compares false: a NaN error is wrong too.
    const bool wrong = !(out_err <= bound && dqkv_err <= bound);
    wrong_any = wrong_any || wrong;
    std::printf(
        "attention_bench kernel=%s fwd_ms=%.4f bwd_ms=%.4f fwd_tflops=%.1f bwd_tflops=%.1f out_err=%.2e "
        "dqkv_err=%.2e wrong=%d\n",
        name.c_str(), fwd_ms, bwd_ms, fwd_flops / fwd_ms * 1e-9, bwd_flops / bwd_ms * 1e-9, out_err, dqkv_err,
        wrong ? 1 : 0);
  }
  return wrong_any ? 1 : 0;
}

}  // namespace

int attention_bench_main(int argc, char** argv, const BackendFactory& make_device) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out as it is printed, also into a file a timeout cuts short
  Args a;
  CLI::App app{"attention_bench: fused causal attention time and TFLOP/s per kernel, checked against the CPU"};
  app.add_option("--device", a.device, "cuda or cpu")->capture_default_str();
  app.add_option("--dtype", a.dtype, "bf16 (compute, qkv, out, dqkv in bf16) or fp32")->capture_default_str();
  app.add_option("--kernels", a.kernels,
                 "comma-separated run.attention_kernel values (default: auto,wmma on cuda bf16)");
  app.add_option("--batch", a.batch, "B")->capture_default_str();
  app.add_option("--seq", a.seq, "T")->capture_default_str();
  app.add_option("--embd", a.embd, "C")->capture_default_str();
  app.add_option("--heads", a.heads, "NH")->capture_default_str();
  app.add_option("--dropout", a.dropout, "attention dropout probability")->capture_default_str();
  app.add_option("--iters", a.iters, "timed calls of each pass")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed calls before them")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is 0; every bad argument is 2, as the checks in run()
  }
  return run(a, make_device);
}

}  // namespace gpt
