// Fault injection for the end-to-end fault tests (tests/apps/*.sh): GPT_TRAIN_FAULT=<kind>:<n>[:<n>...] asks
// one hook to misbehave. This is the one reader of the variable; each hook matches its kind and numbers:
//   kill_during_save:<rank>:<step>   checkpoint_writer.cc    nan_grad:<step>:<unit>   trainer.cc
//   hang_during_save:<rank>:<step>   checkpoint_writer.cc    stop:<rank>:<step>       trainer.cc
//   file_size_limit:<bytes>          checkpoint_writer.cc    hang:<rank>:<step>       trainer.cc
//   skip_collective:<rank>:<seq>     comm_stream.cc          slow_start:<ms>          apps/cmd_train.cc
//   fake_nodes:<n>                   trainer_setup.cc (rank r on node r % n)
//   attention_bench_wrong            scripts/bench/attention_bench.cc (the benchmark's correctness column)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpt {

struct TestFault {
  std::string kind;
  std::vector<int64_t> args;
  // This kind, with exactly `n` numbers.
  bool is(std::string_view k, size_t n) const { return kind == k && args.size() == n; }
};

// GPT_TRAIN_FAULT as it is now, parsed; nullopt when unset or malformed. Hooks on hot paths call it once
// (at construction) and keep the result.
std::optional<TestFault> test_fault();

}  // namespace gpt
