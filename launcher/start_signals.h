#pragma once
// Note [signals before the ranks start]: dp-launch handles the job signals from the first
// statement of main, not from when it spawns the ranks. Until then a signal's default action
// would end it mid-start-up: SIGUSR1 from Slurm's --signal, or a SIGTERM in its first
// milliseconds, killed it (and no child was told) although the ranks are meant to get them.
// - main blocks kJobSignals first thing (hold_job_signals), so one that arrives while dp-launch
//   parses its command line, reads the prompt file or checks the model waits, pending.
// - A stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) is taken at the start-up's checks
//   (stop_if_signalled between its steps; wait_readable_or_stopped and stop_signal_fd inside its
//   waits: the prompts from a pipe, the model check): dp-launch starts no rank, ends the child it
//   was waiting for, leaves the output folder as it found it and exits 128 + the signal, saying
//   "stopped by SIGTERM before any rank started".
// - SIGUSR1 and SIGUSR2 stay pending until the supervisor's signalfd (supervisor.cpp) reads them,
//   once the ranks are started: they are forwarded then, as a later one is.
// - Each rank, the model check and the orphan guard start with nothing blocked (process.cpp,
//   orphan_guard.cpp). Subcommands that start no rank (plan, env, arguments, compare) release the
//   signals: they then act on them as any program does.
// What no program can cover: a signal that arrives before main, while the dynamic loader maps
// dp-launch's libraries (a fraction of a millisecond after exec).

#include <signal.h>

namespace dp::launcher {

// The signals dp-launch forwards to its ranks (docs/launcher.md "Supervision and signals").
inline constexpr int kJobSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
// Of them, those that stop the job.
inline constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Blocks kJobSignals in the calling thread: main's first call.
void hold_job_signals();
// Unblocks them again: a pending one then takes its default action.
void release_job_signals();

// A pending stop signal, taken (no longer pending); 0 when there is none.
int take_stop_signal();
// Throws protocol::Error with exit code 128 + the signal ("stopped by SIGTERM before any rank
// started") when a stop signal is pending, taking it.
void stop_if_signalled();
// A descriptor that polls readable while a stop signal is pending (a signalfd, opened once);
// -1 when none could be made, in which case only stop_if_signalled's checks see them.
int stop_signal_fd();
// Waits until `fd` has data or its end, or a stop signal is pending (then throws as
// stop_if_signalled). Returns at once for a regular file.
void wait_readable_or_stopped(int fd);

}  // namespace dp::launcher
