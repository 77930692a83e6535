// A graceful stop on SIGUSR1 (Slurm's --signal before the time limit), SIGTERM (scancel, preemption) and
// SIGINT (Ctrl-C). The handler only records which signal arrived; the trainer polls stop_signal() once per
// step, agrees with the other ranks (any rank's signal stops all at the same step), writes a checkpoint and
// exits 0, so a requeued job continues with --resume auto. A second SIGINT ends the process at once.
// The recorded signal is process-wide state by nature (a signal handler can reach nothing else).
#pragma once

namespace gpt {

void install_stop_signal_handlers();
// The signal received since install (or the last clear), 0 if none. Async-signal-safe.
int stop_signal();
void clear_stop_signal();
// "SIGUSR1", "SIGTERM", "SIGINT", or "signal N".
const char* stop_signal_name(int sig);

}  // namespace gpt
