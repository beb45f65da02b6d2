"""How busy the console finds the machine: the share of the CPUs that processes other than its own
used, from /proc, measured at most once a window."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mqspark.console.machine import MachineLoad

HZ = os.sysconf("SC_CLK_TCK")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _write_machine(proc: Path, busy: int, idle: int = 0) -> None:
    """/proc/stat of a two-CPU machine whose CPUs spent ``busy`` ticks busy, spread over user, nice,
    system, interrupts and steal (guest time is inside user), and ``idle`` idle and waiting."""
    user, nice, system, irq, softirq = busy // 2, busy // 10, busy // 5, busy // 20, busy // 20
    steal = busy - user - nice - system - irq - softirq
    total = f"cpu  {user} {nice} {system} {idle} {idle} {irq} {softirq} {steal} {user // 3} 0"
    (proc / "stat").write_text(f"{total}\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\nintr 1 2\n")


def _write_process(proc: Path, pid: int, user: int, system: int) -> None:
    (proc / str(pid)).mkdir(exist_ok=True)
    # The command may hold spaces and parentheses: the fields are read after its last ")".
    fields = ["S", *["0"] * 10, str(user), str(system), *["0"] * 30]
    (proc / str(pid) / "stat").write_text(f"{pid} (a (b) c) {' '.join(fields)}\n")


def test_the_share_the_other_processes_used_leaves_out_the_consoles_own(tmp_path: Path) -> None:
    clock, own = _Clock(), [11, 12]
    load = MachineLoad(own=lambda: own, window=1.0, proc=tmp_path, clock=clock)
    _write_machine(tmp_path, busy=1_000)
    _write_process(tmp_path, 11, 100, 20)
    _write_process(tmp_path, 12, 300, 0)
    # A first look measures nothing yet.
    assert (load.others_share(), load.busy()) == (0.0, False)
    # Two seconds of two CPUs: 4 s of CPU; the machine used 3.2 s, 1.2 s of it the console's.
    clock.now += 2.0
    _write_machine(tmp_path, busy=1_000 + round(3.2 * HZ))
    _write_process(tmp_path, 11, 100 + round(0.7 * HZ), 20 + round(0.1 * HZ))
    _write_process(tmp_path, 12, 300 + round(0.4 * HZ), 0)
    assert load.others_share() == pytest.approx(0.5, abs=0.01)
    assert load.busy()
    # Within the window, the same answer without looking again.
    clock.now += 0.5
    _write_machine(tmp_path, busy=1_000 + round(3.2 * HZ))
    assert load.others_share() == pytest.approx(0.5, abs=0.01)
    # Process 12 ended and 13 started: each counts only for what both looks saw.
    clock.now += 0.5
    own[:] = [11, 12, 13]
    (tmp_path / "12" / "stat").unlink()
    (tmp_path / "12").rmdir()
    _write_process(tmp_path, 13, 50, 50)
    _write_machine(tmp_path, busy=1_000 + round(4.0 * HZ))
    _write_process(tmp_path, 11, 100 + round(0.9 * HZ), 20 + round(0.1 * HZ))
    # 1 s of two CPUs: 0.8 s used, 0.2 s of it process 11's.
    assert load.others_share() == pytest.approx(0.3, abs=0.01)
    assert not load.busy()


def test_without_a_proc_file_system_the_machine_is_never_busy(tmp_path: Path) -> None:
    load = MachineLoad(proc=tmp_path / "absent", window=0.0)
    assert [load.others_share(), load.others_share(), load.busy()] == [0.0, 0.0, False]


def test_a_process_burning_a_cpu_makes_the_machine_busy_unless_it_is_the_consoles() -> None:
    cpus = os.cpu_count() or 1
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        others = MachineLoad(own=lambda: [os.getpid()], window=0.5)
        deadline = time.monotonic() + 30
        while not others.busy():
            assert time.monotonic() < deadline, f"busy never seen: last share {others.others_share()}"
            time.sleep(0.1)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def test_the_consoles_own_processes_are_read_from_their_stat_files() -> None:
    """The share with a spinning child counted as the console's is lower than without by what the
    child used, as the kernel gives it to its parent once it ended (getrusage)."""
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    mine = MachineLoad(own=lambda: [spinner.pid], window=0.0)
    every = MachineLoad(own=lambda: [], window=0.0)
    started = time.monotonic()
    mine.others_share(), every.others_share()
    time.sleep(1.5)
    elapsed = time.monotonic() - started
    difference = every.others_share() - mine.others_share()
    spinner.kill()
    spinner.wait()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    # What it used since it started, a little before the window.
    used = sum(getattr(children, field) - getattr(children_before, field) for field in ("ru_utime", "ru_stime"))
    assert used > 0.3
    assert difference * elapsed * (os.cpu_count() or 1) == pytest.approx(used, abs=0.2)
