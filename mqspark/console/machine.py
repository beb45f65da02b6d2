"""How busy the machine is with work other than the console's: the share of its CPUs that every
process but the console's own used over the last second, from Linux's ``/proc``.

The console's answers can wait; the queue managers' work cannot. ``SCHED_IDLE`` keeps the reader
process off a CPU another thread is ready to use, but a streaming get on two cores leaves about a
third of them idle between its steps, and work there still slowed it by 6-9% (see
docs/architecture.md, the console's reader). So, as at(1)'s ``batch`` waits for the load to drop,
the console refreshes its answers less often while the machine is busy (:mod:`.snapshots`)."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

# The machine counts as busy once the other processes use this share of its CPUs or more.
BUSY_SHARE = 0.5
# How long a measurement of the machine's load stands (its window).
WINDOW_SECONDS = 1.0


def console_processes() -> list[int]:
    """This process and the processes it started with multiprocessing (the reader process)."""
    return [os.getpid(), *(child.pid for child in multiprocessing.active_children() if child.pid is not None)]


class MachineLoad:
    """Whether processes other than ``own()`` use ``share`` of the machine's CPUs or more, as measured
    over the last ``window`` seconds of ``clock``; measured again at most once a window, and never
    busy where ``proc`` (Linux's process file system) is not there."""

    def __init__(
        self,
        own: Callable[[], Iterable[int]] = console_processes,
        share: float = BUSY_SHARE,
        window: float = WINDOW_SECONDS,
        proc: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.own, self.share, self.window, self.proc, self.clock = own, share, window, proc, clock
        self._last: tuple[float, int, dict[int, int]] | None = None  # when, busy ticks, own ticks by pid
        self._others = 0.0

    def busy(self) -> bool:
        """Whether the other processes used ``share`` of the CPUs or more in the last window."""
        return self.others_share() >= self.share

    def others_share(self) -> float:
        """The share of the machine's CPUs (0 to 1) the other processes used in the last window."""
        now = self.clock()
        if self._last is not None and now - self._last[0] < self.window:
            return self._others
        try:
            cpus, total = self._machine_ticks()
        except OSError:
            return 0.0
        own = {pid: spent for pid in self.own() if (spent := self._process_ticks(pid)) is not None}
        if self._last is not None:
            at, total_before, own_before = self._last
            if now <= at:
                return self._others
            # A process that started or ended within the window counts only for what both saw.
            used = sum(spent - own_before[pid] for pid, spent in own.items() if pid in own_before)
            available = (now - at) * os.sysconf("SC_CLK_TCK") * cpus
            self._others = max(0.0, min(1.0, (total - total_before - used) / available))
        self._last = (now, total, own)
        return self._others

    def _machine_ticks(self) -> tuple[int, int]:
        """The number of CPUs, and the ticks all of them spent busy since boot (user, nice, system,
        interrupts and steal: all but idle and I/O wait)."""
        lines = (self.proc / "stat").read_text().splitlines()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(n) for n in lines[0].split()[1:9])
        cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        return max(1, cpus), user + nice + system + irq + softirq + steal

    def _process_ticks(self, pid: int) -> int | None:
        """The ticks process ``pid`` (all its threads) spent on a CPU, or None once it ended."""
        try:
            fields = (self.proc / str(pid) / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            return None
        return int(fields[11]) + int(fields[12])
