"""A class-data-sharing archive of the Spark driver JVM's classes (HotSpot AppCDS, JDK 13+), so a
short-lived `cdc apply --once` does not parse and verify Spark's, Delta's and Scala's classes again
on every start (on 2 cores: about 40% of the JVM's start-up CPU; bench/apply_start.py).

One archive per class path, in the user's cache (`$XDG_CACHE_HOME/cdc/jvm`, else `~/.cache/cdc/jvm`,
owner-only: the JVM maps it into itself), named by a digest of what the JVM loads classes from (the
Java runtime, Spark's jars, the pipeline's jars with their sizes and times). A JVM started with no
archive for its key makes one at exit (`-XX:ArchiveClassesAtExit`, into a file of its own); this
process then waits for that JVM to exit (up to a minute, then a detached watcher takes over) and
renames the file into place only if the JVM exited 0 and wrote the archive's header (HotSpot's
last write), so a half-written archive is never used. Every later start maps it (`-XX:SharedArchiveFile`). The
JVM checks the archive itself (its class path, the jars' sizes and times, the JDK build): one that
no longer matches is ignored and the JVM starts as without it. Its CDS messages are turned off
(`-Xlog:cds*=off`): they would go to the verb's stdout.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from cdc.ground.private import private_dir

SUFFIX = ".jsa"
KEEP = 6  # archives kept, the most recently used (one per jar set: Delta only, with Iceberg, with Kafka...)
MAKE_WAIT_S = 60.0  # how long the exiting process waits for its JVM to write a new archive
QUIET = "-Xlog:cds*=off"  # CDS warnings (a stale archive, classes it skips) go to stdout by default
# JVM options of a user that choose class sharing themselves: then none of ours
OWN_FLAGS = ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cdc" / "jvm"


def java_runtime() -> Path | None:
    """The java binary Spark's launcher runs (JAVA_HOME first, as bin/spark-class does), resolved."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return Path(home, "bin", "java").resolve()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder or ".", "java")
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.resolve()
    return None


def _stamp(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def archive_key(java: Path, class_path: Iterable[Path], extra: Iterable[str] = ()) -> str:
    """A digest of the JVM (its binary and libjvm) and every jar it loads classes from."""
    runtime = [java, *sorted(java.parent.parent.glob("lib/*/libjvm.so"))]
    parts = [_stamp(p) for p in runtime] + [_stamp(Path(p)) for p in class_path] + list(extra)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def spark_class_path() -> list[Path]:
    """The driver JVM's own class path: the pyspark distribution's jars/ (bin/spark-class)."""
    import pyspark

    return sorted(Path(pyspark.__file__).parent.joinpath("jars").glob("*.jar"))


class Archive:
    """This process's use of the archive for one key: the options for its JVM, and at exit the
    archive made (when this JVM makes it). The file is `<key>-<its size>.jsa`: HotSpot maps an
    archive cut short (a full disk, a partial copy) and dies on SIGBUS rather than refuse it, so a
    file whose size is not the one it was made with is deleted here, never given to the JVM."""

    def __init__(self, folder: Path, key: str):
        self.folder = folder
        self.stem = folder / key
        self.making: Path | None = None  # the file this process's JVM writes at exit

    def found(self) -> Path | None:
        """The archive for this key if whole (the size it was made with), else None."""
        for path in self.folder.glob(f"{self.stem.name}-*{SUFFIX}"):
            made_size = path.name.removesuffix(SUFFIX).rpartition("-")[2]
            try:
                if path.stat().st_size == int(made_size):
                    return path
            except (OSError, ValueError):
                pass
            path.unlink(missing_ok=True)
        return None

    def java_options(self, make: bool = True) -> str:
        """`-XX:SharedArchiveFile` when the archive exists, else (when `make`) `-XX:ArchiveClassesAtExit`
        into a file of this process's own (two first runs at once each make one; the last rename wins)."""
        private_dir(self.folder)
        path = self.found()
        if path is not None:
            with contextlib.suppress(OSError):
                os.utime(path)  # used now: pruned last
            return f"-XX:SharedArchiveFile={path} {QUIET}"
        if not make:
            return ""
        self.making = self.folder / f"{self.stem.name}.{os.getpid()}.part"
        return f"-XX:ArchiveClassesAtExit={self.making} {QUIET}"

    def finish(self, jvm: subprocess.Popen | None, wait_s: float = MAKE_WAIT_S) -> bool:
        """At exit, when this process's JVM makes the archive: end the JVM (closing its stdin is how
        pyspark's gateway is told to exit), wait for it to write the archive, keep it if the JVM
        exited 0 and the file is whole. A JVM still writing after `wait_s` (a loaded machine) is
        left to a detached watcher that keeps the file once the JVM is gone, so this process's exit
        waits no longer. Returns whether an archive was put in place now."""
        made, self.making = self.making, None
        if made is None or jvm is None:
            return False
        try:
            if jvm.stdin is not None:
                jvm.stdin.close()
            code = jvm.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            _watch(jvm.pid, made, self.stem)
            return False
        except OSError:
            return False  # left as .part: pruned later
        return keep(made, self.stem) if code == 0 else _drop(made)


# HotSpot writes an archive's header, which starts with this number, after everything else: a file
# without it is one the JVM did not finish
DYNAMIC_MAGIC = 0xF00BABA8


def whole(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return int.from_bytes(f.read(4), "little") == DYNAMIC_MAGIC
    except OSError:
        return False


def keep(made: Path, stem: Path) -> bool:
    """Put a finished archive in place as `<stem>-<size>.jsa` (a rename: a JVM starting meanwhile
    sees the old one or the new one), the key's older ones removed."""
    if not whole(made):
        return _drop(made)
    final = stem.parent / f"{stem.name}-{made.stat().st_size}{SUFFIX}"
    os.replace(made, final)
    for other in stem.parent.glob(f"{stem.name}-*{SUFFIX}"):
        if other != final:
            other.unlink(missing_ok=True)
    prune(stem.parent)
    return True


def _drop(made: Path) -> bool:
    made.unlink(missing_ok=True)
    return False


def _watch(pid: int, made: Path, stem: Path) -> None:
    """A detached process (its own session: the verb's exit does not wait) that keeps `made` once
    the JVM `pid` has exited (main() below)."""
    import sys

    devnull = subprocess.DEVNULL
    argv = [sys.executable, "-m", "pipelines.jvmarchive", str(pid), str(made), str(stem)]
    with contextlib.suppress(OSError):
        subprocess.Popen(argv, stdin=devnull, stdout=devnull, stderr=devnull, start_new_session=True)


def main(argv: list[str]) -> int:
    """`python -m pipelines.jvmarchive PID PART STEM`: wait (up to 30 minutes) for the JVM to be
    gone, then keep its archive if whole."""
    pid, made, stem = int(argv[0]), Path(argv[1]), Path(argv[2])
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:  # the pid is someone else's now
            break
        time.sleep(0.5)
    else:
        return 1  # still writing: left as .part, pruned later
    keep(made, stem)
    return 0


def prune(folder: Path, keep: int = KEEP, stale_part_s: float = 3600.0) -> None:
    """Keep the `keep` most recently used archives; drop parts older than an hour (a JVM killed
    while writing one)."""
    now = time.time()
    archives: list[tuple[float, Path]] = []
    for entry in folder.iterdir():
        try:
            mtime = entry.stat().st_mtime
        except OSError:
            continue
        if entry.name.endswith(".part"):
            if now - mtime > stale_part_s:
                entry.unlink(missing_ok=True)
        elif entry.name.endswith(SUFFIX):
            archives.append((mtime, entry))
    for _mtime, old in sorted(archives, reverse=True)[keep:]:
        old.unlink(missing_ok=True)


def chooses_own(options: Iterable[str]) -> bool:
    """The user's JVM options set class sharing themselves (or turn it off)."""
    return any(flag in text for text in options for flag in OWN_FLAGS)


def layout_options(options: Iterable[str], heap: str | None) -> list[str]:
    """What of the driver's JVM options decides whether an archive can be mapped at all: compressed
    pointers (switched by hand, or off with a heap of 32 GB or more). The rest (JIT tiers, -D...)
    does not, and stays out of the key, so a pipeline's Derby home does not make an archive of its own."""
    flags = sorted(f for text in options for f in text.split() if "Compressed" in f)
    return [*flags, f"heap={heap or ''}"]


def archive_for(
    jars: Iterable[str], conf_dir: Path, class_path: Iterable[str] = (), layout: Iterable[str] = ()
) -> Archive | None:
    """The archive of a driver JVM with these spark.jars, extra class path entries (before Spark's)
    and layout_options(), or None when no java is found."""
    java = java_runtime()
    if java is None:
        return None
    entries = [*map(Path, class_path), *spark_class_path(), *map(Path, jars)]
    return Archive(cache_dir(), archive_key(java, entries, [str(conf_dir), *layout]))


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
