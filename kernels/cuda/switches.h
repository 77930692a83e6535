// The CUDA backend's environment switches (its experiments, the profile), each with the values it takes. They are
// read where they act (kernels/cuda/*.cu), most at each launch; a value none of them knows would act as the default
// without a word, so a typo in a benchmark's variant (GPT_ATTENTION_WGMMA_RS=kvv) would measure the default under
// another name. make_cuda_backend refuses such a value, naming the variable and what it takes. Plain C++ (no CUDA
// headers), like workspace.h, so that the CPU tests check the table.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace gpt::cuda_switches {

struct Switch {
  const char* name;
  std::vector<std::string_view> values;  // the values it takes (none listed: any, a path); with `list`, the parts
  bool list = false;                     // 0, 1, or a comma-separated list of `values` (env_lists)
  const char* what;                      // what it does, for the error
};

inline const std::vector<Switch>& all() {
  static const std::vector<Switch> table = {
      {"GPT_TRAIN_CUDA_PROFILE", {"0", "1"}, false, "the per-op device-time profile"},
      {"GPT_GEMM_ALGOS",
       {"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16"},
       false,
       "how many of cuBLASLt's algorithms to time per GEMM shape"},
      {"GPT_GEMM_DGELU_BGRAD", {"0", "1"}, false, "the fc bias gradient in the DGELU GEMM's epilogue"},
      {"GPT_GEMM_WGRAD_STREAM", {"0", "1"}, false, "weight gradients on a second stream"},
      {"GPT_GEMM_ALGO_CACHE", {}, false, "the file of GEMM algorithms kept per shape"},
      {"GPT_CE_ROW_IN_SMEM", {"0", "1"}, false, "the cross-entropy's rows in shared memory"},
      {"GPT_ATTENTION_FWD_ROWS", {"16", "32"}, false, "the mma.sync forward's query rows per warp"},
      {"GPT_ATTENTION_BWD_BLOCKS", {"2", "3"}, false, "the mma.sync backward's kernels by blocks per SM"},
      {"GPT_ATTENTION_DQ", {"keep", "recompute"}, false, "dQ from the kept dS^T or recomputed"},
      {"GPT_ATTENTION_ORDER", {"lpt", "head"}, false, "the causal attention kernels' order of tiles"},
      {"GPT_ATTENTION_WGMMA", {"0", "1", "fwd"}, false, "the wgmma attention kernels: none, both, the forward only"},
      {"GPT_ATTENTION_WGMMA_BQ", {"32", "64", "128"}, false, "the wgmma dK/dV kernel's queries per step"},
      {"GPT_ATTENTION_WGMMA_BIAS", {"0", "1"}, false, "the qkv bias gradient summed by the wgmma backward"},
      {"GPT_ATTENTION_WGMMA_BK", {"64", "128"}, false, "the wgmma forward's keys per tile"},
      {"GPT_ATTENTION_WGMMA_FWD_BLOCKS", {"4", "5"}, false, "the wgmma forward's blocks per SM"},
      {"GPT_ATTENTION_WGMMA_OVERLAP", {"0", "1", "fwd", "bwd"}, false, "the overlapped wgmma kernels"},
      {"GPT_ATTENTION_WGMMA_WS", {"0", "2", "3"}, false, "the warp-specialised wgmma forward's consumer warpgroups"},
      {"GPT_ATTENTION_WGMMA_WS_KV", {"0", "2", "3"}, false, "the warp-specialised wgmma dK/dV kernel's consumers"},
      {"GPT_ATTENTION_WGMMA_WG2", {"fwd", "kv", "dq"}, true, "blocks of two warpgroups"},
      {"GPT_ATTENTION_WGMMA_RS", {"fwd", "kv"}, true, "tiles held in registers"},
      {"GPT_ATTENTION_WGMMA_DS_STAGE", {"0", "1"}, false, "the wgmma dK/dV kernel's dS^T staged in shared memory"},
  };
  return table;
}

// The comma-separated parts of a list switch's value ("a,,b": a, the empty part, b).
inline std::vector<std::string_view> parts(std::string_view list) {
  std::vector<std::string_view> out;
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    out.push_back(list.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// Whether `value` is one `s` takes.
inline bool takes(const Switch& s, std::string_view value) {
  auto known = [&](std::string_view v) { return std::find(s.values.begin(), s.values.end(), v) != s.values.end(); };
  if (!s.list) return known(value);
  if (value == "0" || value == "1") return true;
  const std::vector<std::string_view> ps = parts(value);
  return std::all_of(ps.begin(), ps.end(), known);
}

// The first switch set in the environment to a value it does not take, as an error message; empty when none is.
inline std::string first_error() {
  for (const Switch& s : all()) {
    const char* v = std::getenv(s.name);
    if (v == nullptr || s.values.empty() || takes(s, v)) continue;  // no values listed: any (a path)
    std::string expected;
    for (size_t i = 0; i < s.values.size(); ++i) {
      expected += (i == 0 ? "" : i + 1 == s.values.size() ? " or " : ", ") + std::string(s.values[i]);
    }
    if (s.list) expected = "0, 1, or a comma-separated list of " + expected;
    return std::string(s.name) + "=" + v + " (" + s.what + "): expected " + expected;
  }
  return "";
}

}  // namespace gpt::cuda_switches
