"""Running a command and measuring it: wall time from spawn to exit, peak RSS, CPU time.

Two ways to count a command's CPU: `cpu_s` is the process's own (and its reaped children's)
user+sys time from wait4, exact for `cdc stream`/`snapshot`, pg_recvlogical and psql;
`tree_cpu_s` (with `tree=True`) samples every live descendant from /proc every 0.2 s, for
commands whose work is done by children that may outlive the sample (Spark's JVM, Python
workers). `cluster_cpu_s` is what a PostgreSQL cluster spent, all its processes.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Timed:
    argv: list[str]
    code: int
    wall_s: float
    peak_rss_bytes: int | None  # VmHWM of the process itself (polled from /proc while it runs)
    cpu_user_s: float
    cpu_sys_s: float
    out: str = field(repr=False)
    err: str = field(repr=False)
    server_cpu_s: float | None = None  # CPU the PostgreSQL cluster used meanwhile (all its processes)
    tree_cpu_s: float | None = None  # the whole process tree's CPU (tree=True)
    tree_peak_rss: dict[str, int] = field(
        default_factory=dict
    )  # tree=True: command name -> highest VmHWM of a descendant

    @property
    def cpu_s(self) -> float:
        return self.cpu_user_s + self.cpu_sys_s


def _stat(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat after "pid (comm) ": [0] is state, [1] ppid, [11:15] utime stime cutime cstime."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _ticks(fields: list[str], with_children: bool) -> int:
    return sum(int(f) for f in fields[11 : 15 if with_children else 13])


def _vm_hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _tree_ticks(root: int, seen: dict[int, int], peaks: dict[str, int] | None = None) -> None:
    """Record utime+stime (own + reaped children) of `root` and every live descendant in `seen`;
    with `peaks`, each descendant's VmHWM under its command name (java, python...), the highest."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields:
            parents[int(entry.name)] = int(fields[1])
            ticks[int(entry.name)] = _ticks(fields, True)
    for pid, n in ticks.items():
        p = pid
        while p and p != root:
            p = parents.get(p, 0)
        if p == root:
            seen[pid] = max(seen.get(pid, 0), n)
            hwm = _vm_hwm(pid) if peaks is not None and pid != root else None
            if hwm:  # (a process that exited meanwhile has none)
                name = _comm(pid)
                peaks[name] = max(peaks.get(name, 0), hwm)


def proc_cpu_s(pid: int | None) -> float:
    """user+sys CPU seconds of one live process (not its children)."""
    fields = _stat(pid) if pid else None
    return _ticks(fields, False) / _TICK if fields else 0.0


def cluster_cpu_s(postmaster: int) -> float:
    """user+sys CPU seconds of a PostgreSQL cluster so far: the postmaster with its reaped children
    (cutime/cstime) plus every live child. Exited backends count through the postmaster."""
    total = _ticks(_stat(postmaster) or [], True)
    for entry in os.scandir("/proc"):
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields and int(fields[1]) == postmaster:
            total += _ticks(fields, True)
    return total / _TICK


def run_timed(
    argv: list[str],
    env: dict[str, str],
    workdir: Path,
    name: str,
    *,
    stdout_null: bool = False,
    tree: bool = False,
    timeout: float = 3600,
) -> Timed:
    """Run argv with stdout/stderr to files in workdir (stdout to /dev/null if asked).

    The process is waited for without reaping first (WNOWAIT), so the last /proc sample is
    taken while the pid is still ours; then os.wait4 gives its own CPU time."""
    out_path, err_path = workdir / f"{name}.out", workdir / f"{name}.err"
    with open(os.devnull if stdout_null else out_path, "wb") as out, open(err_path, "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=REPO)
        peak: list[int] = [0]
        seen: dict[int, int] = {}
        peaks: dict[str, int] = {}
        done = threading.Event()

        def poll() -> None:
            polls = 0
            while not done.is_set():
                peak[0] = max(peak[0], _vm_hwm(proc.pid) or 0)
                if tree and polls % 10 == 0:  # a /proc walk every 0.2 s, RSS every 20 ms
                    _tree_ticks(proc.pid, seen, peaks)
                polls += 1
                done.wait(0.02)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            wall = time.perf_counter() - started
            peak[0] = max(peak[0], _vm_hwm(proc.pid) or 0)  # a zombie has no memory map: usually 0
            done.set()
            poller.join()
            if tree:
                _tree_ticks(proc.pid, seen, peaks)
            _pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            watchdog.cancel()
            done.set()
    return Timed(
        list(argv),
        proc.returncode,
        wall,
        peak[0] or None,
        usage.ru_utime,
        usage.ru_stime,
        "" if stdout_null else out_path.read_text(errors="replace"),
        err_path.read_text(errors="replace"),
        tree_cpu_s=sum(seen.values()) / _TICK if tree else None,
        tree_peak_rss=peaks,
    )


def checked(result: Timed, what: str) -> Timed:
    if result.code != 0:
        raise RuntimeError(f"{what} failed (exit {result.code}):\n{result.out[-2000:]}\n{result.err[-2000:]}")
    return result


def cpu_note(t: Timed) -> str:
    server = "" if t.server_cpu_s is None else f", PostgreSQL CPU {t.server_cpu_s:.1f}s"
    return f"CPU {t.cpu_s:.1f}s{server}"


def dir_bytes(path: Path) -> int:
    """Allocated bytes below path, as du counts them."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a file may vanish (SQLite -shm) while we walk
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def medians(runs: list[Timed], amount: float, rate_key: str) -> dict[str, float | list[float] | None]:
    """Repeated runs of one measurement: median wall time and `amount` / it as `rate_key`, median
    client and server CPU, the highest peak RSS, and every run's wall time."""
    wall = statistics.median(r.wall_s for r in runs)
    return {
        "wall_s": wall,
        rate_key: amount / wall,
        "cpu_s": statistics.median(r.cpu_s for r in runs),
        "server_cpu_s": statistics.median(r.server_cpu_s or 0 for r in runs),
        "peak_rss_bytes": max(r.peak_rss_bytes or 0 for r in runs) or None,
        "runs_s": [r.wall_s for r in runs],
    }


def live_tree_cpu_s(root: int) -> float:
    """user+sys CPU seconds so far of a running process and its live descendants (a long-running
    command sampled twice: what it spent between the samples, e.g. while idle)."""
    seen: dict[int, int] = {}
    _tree_ticks(root, seen)
    return sum(seen.values()) / _TICK
