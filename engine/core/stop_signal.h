// A graceful stop on SIGUSR1 (Slurm's --signal before the time limit), SIGTERM (scancel, preemption) and
// SIGINT (Ctrl-C). The trainer polls stop_signal() once per step, agrees with the other ranks (any rank's
// signal stops all at the same step), writes a checkpoint and exits 0, so a requeued job continues with
// --resume auto. A second SIGINT ends the process at once.
//
// The signals are taken synchronously: block_stop_signals(), first thing in main() before MPI or OpenMP start
// any thread, blocks them in the main thread, so every thread created later inherits the block, and starts one
// thread that waits for them (sigwait) and records which arrived. No signal is ever delivered to another thread,
// so none interrupts a system call or a library (MPI's progress, the BLAS, malloc) halfway. Until
// arm_stop_signals() (the train command, once its trainer is built) a signal ends the process as it would by
// default. The recorded signal is process-wide state by nature.
#pragma once

namespace gpt {

// Call once, before any other thread exists.
void block_stop_signals();
// From now on SIGUSR1/SIGTERM/SIGINT are recorded for stop_signal() instead of ending the process.
void arm_stop_signals();
// The signal received since arming (or the last clear), 0 if none.
int stop_signal();
void clear_stop_signal();
// "SIGUSR1", "SIGTERM", "SIGINT", or "signal N".
const char* stop_signal_name(int sig);

}  // namespace gpt
