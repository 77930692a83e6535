// The collective watchdog (comm.timeout_s). A thread checks every communicator's comm stream once a second;
// when a collective has been running longer than the timeout (a rank skipped it, took another branch, or
// died), it logs this rank's last CommStream::kHistory collectives of every communicator, exchanges those
// histories with the other ranks over a channel of its own (the stuck communicators cannot be used), and
// calls on_hang with a diagnosis naming the first collective where ranks disagree; on_hang ends the job
// (MPI_Abort). If the other ranks do not answer within the timeout either, the diagnosis says so and uses
// this rank's history alone.
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
  void start(double timeout_s, int rank, HistoryExchange exchange, std::function<void(const std::string&)> on_hang);

 private:
  void loop();
  std::mutex mu_;
  std::vector<const CommStream*> streams_;
  double timeout_s_ = 0;
  int rank_ = 0;
  HistoryExchange exchange_;
  std::function<void(const std::string&)> on_hang_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gpt
