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
#include <vector>

#include "comm/comm_stream.h"

namespace gpt {

// Every rank's history, indexed by rank. Returns nullopt when not every rank answered in time.
using HistoryExchange =
    std::function<std::optional<std::vector<std::vector<CollectiveRecord>>>(const std::vector<CollectiveRecord>&)>;
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

  void watch(const CommStream* stream);
  void unwatch(const CommStream* stream);
  // Starts checking (once). `on_hang` receives the diagnosis and must not return (it aborts the job).
  void start(double timeout_s, int rank, WatchdogChannel channel, std::function<void(const std::string&)> on_hang);

 private:
  void loop();
  std::mutex mu_;
  std::vector<const CommStream*> streams_;
  double timeout_s_ = 0;
  int rank_ = 0;
  WatchdogChannel channel_;
  std::function<void(const std::string&)> on_hang_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gpt
