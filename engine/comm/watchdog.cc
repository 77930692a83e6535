#include "comm/watchdog.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <set>

namespace gpt {

namespace {

std::string describe(const CollectiveRecord& r) {
  return fmt::format("{} of {} elements{}", comm_op_name(r.op), r.elements, r.done ? "" : " (not finished)");
}

}  // namespace

std::string diagnose_hang(const std::vector<std::vector<CollectiveRecord>>& ranks) {
  // group -> seq -> rank -> record
  std::map<std::string, std::map<uint64_t, std::map<int, CollectiveRecord>>> by_group;
  std::map<std::string, std::map<int, uint64_t>> last_seq;  // group -> rank -> highest seq issued
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const CollectiveRecord& rec : ranks[r]) {
      by_group[rec.group][rec.seq][static_cast<int>(r)] = rec;
      uint64_t& last = last_seq[rec.group][static_cast<int>(r)];
      last = std::max(last, rec.seq);
    }
  }
  for (const auto& [group, seqs] : by_group) {
    for (const auto& [seq, recs] : seqs) {
      const auto& [r0, first] = *recs.begin();
      for (const auto& [r, rec] : recs) {
        if (rec.op != first.op || rec.elements != first.elements) {
          return fmt::format(
              "ranks disagree at {} collective #{}: rank {} issued {}, rank {} issued {} (a rank skipped or added "
              "a collective before it)",
              group, seq, r0, describe(first), r, describe(rec));
        }
      }
    }
  }
  for (const auto& [group, seqs] : by_group) {
    for (const auto& [seq, recs] : seqs) {
      for (const auto& [r, last] : last_seq[group]) {
        if (last < seq) {
          const auto& [other, rec] = *recs.begin();
          return fmt::format("rank {} never issued {} collective #{} ({} on rank {}); its last was #{}", r, group, seq,
                             describe(rec), other, last);
        }
      }
    }
  }
  for (const auto& [group, seqs] : by_group) {
    for (const auto& [seq, recs] : seqs) {
      for (const auto& [r, rec] : recs) {
        if (!rec.done) {
          return fmt::format("{} collective #{} ({}) was issued by every rank that answered but has not finished",
                             group, seq, describe(rec));
        }
      }
    }
  }
  return "the ranks' recent collectives agree";
}

CommWatchdog::~CommWatchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void CommWatchdog::watch(const CommStream* stream, bool slow) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.emplace_back(stream, slow);
}

void CommWatchdog::unwatch(const CommStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(streams_, [stream](const auto& s) { return s.first == stream; });
}

void CommWatchdog::start(double timeout_s, double save_timeout_s, int rank, WatchdogChannel channel,
                         std::function<void(const std::string&)> on_hang) {
  if (thread_.joinable() || timeout_s <= 0) return;
  timeout_s_ = timeout_s;
  save_timeout_s_ = save_timeout_s;
  rank_ = rank;
  channel_ = std::move(channel);
  on_hang_ = std::move(on_hang);
  thread_ = std::thread([this] { loop(); });
}

void CommWatchdog::loop() {
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::vector<CollectiveRecord> mine;
    std::string fired;  // "a collective of <group> has not finished after N s (comm.timeout_s)"
    bool alerted = false;
    std::string blocked;  // "; blocked in ncclCommInitRank (nccl:world)": host calls in progress
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [s, slow] : streams_) {
        const double limit = slow ? save_timeout_s_ : timeout_s_;
        const double running = s->running_for().value_or(0.0);
        if (limit > 0 && running >= limit && fired.empty()) {
          fired = fmt::format("a {} collective has not finished after {:.0f} s (comm.{})", s->group(), running,
                              slow ? "save_timeout_s" : "timeout_s");
        }
      }
      if (fired.empty() && !(alerted = channel_.alerted())) continue;
      for (const auto& [s, slow] : streams_) {
        const auto h = s->history();
        mine.insert(mine.end(), h.begin(), h.end());
        if (const char* what = s->blocked_in()) blocked += fmt::format("; blocked in {} ({})", what, s->group());
      }
    }
    if (!alerted) channel_.alert_all();
    std::string lines;
    // Each line names its rank: the ranks' lists land in one log, interleaved.
    for (const CollectiveRecord& r : mine) {
      lines += fmt::format("\n  [rank {}] {} #{}: {}", rank_, r.group, r.seq, describe(r));
    }
    spdlog::error("{}{}; this rank's last collectives:{}",
                  alerted ? std::string("another rank's collective watchdog fired") : fired, blocked, lines);
    const std::vector<std::optional<std::vector<CollectiveRecord>>> answers = channel_.exchange(mine);
    // The ranks that did not answer (their process stopped or died, or is stuck with its watchdog) are named; the
    // others' histories are compared among themselves.
    std::vector<std::vector<CollectiveRecord>> histories(answers.size());
    std::string silent;
    for (size_t r = 0; r < answers.size(); ++r) {
      if (answers[r]) {
        histories[r] = *answers[r];
      } else {
        silent += (silent.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    std::string diagnosis = diagnose_hang(histories);
    if (!silent.empty()) {
      diagnosis = fmt::format(
          "rank(s) {} did not answer within comm.timeout_s (stopped, dead, or stuck outside any collective, watchdog "
          "included); among the ranks that answered: {}",
          silent, diagnosis);
    }
    on_hang_(fmt::format("collective watchdog on rank {}: {}{}", rank_, diagnosis, blocked));
    return;
  }
}

}  // namespace gpt
