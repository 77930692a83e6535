// CommStream and Work: tasks run in submission order off the caller's thread; wait() blocks until a task has
// run; join() runs the communicator's device hook instead of blocking when there is one (NCCL: the compute
// stream waits on the GPU), and is wait() otherwise.
#include "comm/comm_stream.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

namespace gpt {
namespace {

TEST_CASE("CommStream runs tasks in order, Work::join waits unless a device hook takes over", "[comm]") {
  CommStream stream("test", 0);
  std::atomic<bool> release{false};
  std::vector<int> order;
  auto gated = [&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    order.push_back(1);
  };

  SECTION("without a hook, join() blocks until the task has run") {
    Work w = stream.submit(CommOp::kAllReduce, 4, 16, gated);
    Work later = stream.submit(CommOp::kAllGather, 4, 16, [&] { order.push_back(2); });
    CHECK_FALSE(w.is_done());
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      release = true;
    });
    w.join();
    CHECK(w.is_done());
    later.wait();
    opener.join();
    CHECK(order == std::vector<int>{1, 2});
  }

  SECTION("with a hook, join() runs it and returns while the task is still pending") {
    int hooked = 0;
    Work w = stream.submit(CommOp::kReduceScatter, 4, 16, gated, [&] { ++hooked; });
    w.join();
    CHECK(hooked == 1);
    CHECK_FALSE(w.is_done());  // the gate is still shut: join did not wait
    release = true;
    w.wait();  // wait() still blocks for the task itself
    CHECK(w.is_done());
    CHECK(hooked == 1);
    CHECK(order == std::vector<int>{1});
  }

  const CommStats s = stream.stats();
  CHECK(s.ops[static_cast<size_t>(CommOp::kAllReduce)].calls +
            s.ops[static_cast<size_t>(CommOp::kReduceScatter)].calls ==
        1);
}

}  // namespace
}  // namespace gpt
