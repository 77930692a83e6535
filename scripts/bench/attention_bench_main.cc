// attention_bench on the backends gpt-train itself runs on (engine/backend/registry.cc).
#include "attention_bench.h"

int main(int argc, char** argv) {
  return gpt::attention_bench_main(argc, argv, [](std::string_view device) { return gpt::make_backend(device); });
}
