// diagnose_hang: the watchdog's reading of every rank's recent collectives; the watchdog on a host call.
#include "comm/watchdog.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

namespace gpt {
namespace {

CollectiveRecord rec(uint64_t seq, CommOp op, int64_t n, bool done = true, std::string group = "world") {
  return {std::move(group), seq, op, n, done};
}

TEST_CASE("diagnose_hang names the first collective where ranks disagree", "[comm]") {
  // Rank 1 skipped #2 (an all_gather of 10), so its #2 is rank 0's #3.
  const std::vector<std::vector<CollectiveRecord>> skipped = {
      {rec(1, CommOp::kAllReduce, 4), rec(2, CommOp::kAllGather, 10, false), rec(3, CommOp::kReduceScatter, 8, false)},
      {rec(1, CommOp::kAllReduce, 4), rec(2, CommOp::kReduceScatter, 8, false)}};
  CHECK(diagnose_hang(skipped) ==
        "ranks disagree at world collective #2: rank 0 issued all_gather of 10 elements (not finished), rank 1 "
        "issued reduce_scatter of 8 elements (not finished) (a rank skipped or added a collective before it)");
  // Rank 1 stopped issuing collectives (stuck in compute, or gone).
  const std::vector<std::vector<CollectiveRecord>> behind = {
      {rec(1, CommOp::kAllReduce, 4), rec(2, CommOp::kBarrier, 0, false)}, {rec(1, CommOp::kAllReduce, 4)}};
  CHECK(diagnose_hang(behind) ==
        "rank 1 never issued world collective #2 (barrier of 0 elements (not finished) on rank 0); its last was #1");
  // Every rank is in the same collective: a slow or broken network rather than a program bug.
  const std::vector<std::vector<CollectiveRecord>> same = {{rec(7, CommOp::kAllReduce, 4, false, "shard")},
                                                           {rec(7, CommOp::kAllReduce, 4, false, "shard")}};
  CHECK(diagnose_hang(same) ==
        "shard collective #7 (all_reduce of 4 elements (not finished)) was issued by every rank that answered but "
        "has not finished");
  CHECK(diagnose_hang({{rec(1, CommOp::kAllReduce, 4)}, {rec(1, CommOp::kAllReduce, 4)}}) ==
        "the ranks' recent collectives agree");
}

// A rank blocked in a call on its own thread (NCCL's ncclCommInitRank, waiting for a peer that never comes) is
// stuck as surely as in a collective: the watchdog fires on the host call and names it.
TEST_CASE("the watchdog fires on a host call that outlives comm.timeout_s, naming it", "[comm]") {
  CommStream stream("nccl:world", 0);
  CHECK_FALSE(stream.running_for().has_value());
  CHECK(stream.blocked_in() == nullptr);
  std::mutex mu;
  std::condition_variable cv;
  std::string report;
  {
    CommWatchdog watchdog;
    watchdog.watch(&stream);
    WatchdogChannel channel;  // one rank: its own history is everyone's
    channel.exchange = [](const std::vector<CollectiveRecord>& mine) {
      return std::vector<std::optional<std::vector<CollectiveRecord>>>{mine};
    };
    channel.alert_all = [] {};
    channel.alerted = [] { return false; };
    watchdog.start(0.3, 0, 0, channel, [&](const std::string& why) {
      std::lock_guard<std::mutex> lock(mu);
      report = why;
      cv.notify_all();
    });
    {
      const CommStream::HostCall call = stream.host_call("ncclCommInitRank");
      CHECK(std::string(stream.blocked_in()) == "ncclCommInitRank");
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::seconds(20), [&] { return !report.empty(); });
      REQUIRE(stream.running_for().has_value());
      CHECK(*stream.running_for() >= 0.3);
    }
    watchdog.unwatch(&stream);
  }
  CHECK(report ==
        "collective watchdog on rank 0: the ranks' recent collectives agree; blocked in ncclCommInitRank "
        "(nccl:world)");
  // Over: nothing running, nothing blocked.
  CHECK_FALSE(stream.running_for().has_value());
  CHECK(stream.blocked_in() == nullptr);
}

}  // namespace
}  // namespace gpt
