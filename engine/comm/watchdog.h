// The collective watchdog (comm.timeout_s). A thread checks every communicator's comm stream five times a
// second; when a collective has been running longer than the timeout (a rank skipped it, took another
// branch, or died), it alerts every other rank's watchdog, so that ranks which are not stuck in a collective
// take part too; then each rank logs its last CommStream::kHistory collectives of every communicator, the
// histories are exchanged over a channel of their own (the stuck communicators cannot be used), and on_hang
// gets a diagnosis naming the first collective where ranks disagree; on_hang ends the job (MPI_Abort). If
// some rank does not answer within the timeout (dead, or stuck outside our code), the diagnosis says so and
// uses this rank's history alone.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/comm_stream.h"

namespace gpt {

// Every rank's history, indexed by rank: nullopt for a rank that did not answer in time (stopped, dead, or stuck
// outside our code with its watchdog).
using HistoryExchange =
    std::function<std::vector<std::optional<std::vector<CollectiveRecord>>>(const std::vector<CollectiveRecord>&)>;
// How the watchdogs of different ranks reach each other: `alert_all` tells every other rank's watchdog to
// report now; `alerted` says whether another rank has done so (polled; must not block).
struct WatchdogChannel {
  HistoryExchange exchange;
  std::function<void()> alert_all;
  std::function<bool()> alerted;
};

// The first disagreement between the ranks' histories: per group, the lowest sequence number where two ranks
// recorded different collectives (op or size), else the lowest one some rank has not issued while another
// has, else the oldest one still running. A sentence naming the group, number, ranks and collectives.
std::string diagnose_hang(const std::vector<std::vector<CollectiveRecord>>& ranks);

class CommWatchdog {
 public:
  CommWatchdog() = default;
  ~CommWatchdog();  // stops the thread
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  // `slow`: a stream whose collectives wait on file systems (the checkpoint writer's), held to save_timeout_s.
  void watch(const CommStream* stream, bool slow = false);
  void unwatch(const CommStream* stream);
  // Starts checking (once): a collective of a stream running longer than timeout_s (a slow one's: save_timeout_s; 0 =
  // never) fires it. `on_hang` receives the diagnosis and must not return (it aborts the job).
  void start(double timeout_s, double save_timeout_s, int rank, WatchdogChannel channel,
             std::function<void(const std::string&)> on_hang);

 private:
  void loop();
  std::mutex mu_;
  std::vector<std::pair<const CommStream*, bool>> streams_;  // and whether it is slow
  double timeout_s_ = 0, save_timeout_s_ = 0;
  int rank_ = 0;
  WatchdogChannel channel_;
  std::function<void(const std::string&)> on_hang_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gpt
