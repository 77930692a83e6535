// attention_bench's program (attention_bench.cc), with the backend factory as a parameter: attention_bench_main.cc
// runs it on the registry's backends, tests/cuda_emu/attention_bench_emu.cc on the CUDA emulator's.
#pragma once

#include <functional>
#include <memory>
#include <string_view>

#include "backend/backend.h"
#include "core/status.h"

namespace gpt {

// The backend for --device (cpu or cuda).
using BackendFactory = std::function<Expected<std::unique_ptr<Backend>>(std::string_view device)>;

// Parses argv (see attention_bench.cc), runs, returns the exit status.
int attention_bench_main(int argc, char** argv, const BackendFactory& make_device);

}  // namespace gpt
