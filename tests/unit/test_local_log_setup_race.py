"""Two processes opening a new log at once (`cdc snapshot` beside `cdc stream`, as CI's
test_unreachable_broker_fails_fast_and_clearly does) both set it up: before the setup lock, about
half of such pairs failed with "database is locked" or "duplicate column name" (200 pairs of
processes: 106 failures), and the verb said "internal error". Threads race the same way (each has
its own connection and its own flock file descriptor) and start in microseconds, not processes'
tenths of a second: 200 pairs of threads, 54 failures before the lock."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cdc.log.local import LocalLog

pytestmark = pytest.mark.unit


def open_at_once(path: Path, readonly: tuple[bool, ...]) -> list[str]:
    """Opens the log once per entry of `readonly`, all at the same moment; what each one got."""
    start = threading.Barrier(len(readonly))
    got: list[str] = []

    def open_and_close(ro: bool) -> None:
        start.wait()
        try:
            log = LocalLog(path, readonly=ro)
            got.append(f"reader: {log.tables()}" if ro else log.log_id)
            log.close()
        except Exception as e:  # the test reports what failed
            got.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=open_and_close, args=(ro,)) for ro in readonly]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return got


def test_two_writers_opening_a_new_log_at_once_both_get_it(tmp_path: Path) -> None:
    for round_ in range(100):
        path = tmp_path / f"log{round_}"
        writers = open_at_once(path, (False, False))
        assert len(set(writers)) == 1 and len(writers[0]) == 12, writers  # one log, one id, no error
        assert sorted(open_at_once(path, (True, False))) == sorted(["reader: []", writers[0]])


def test_a_reader_opening_a_log_being_set_up_waits_for_it(tmp_path: Path) -> None:
    """A reader never sees a half-made log: it finds none yet, or the whole of it."""
    for round_ in range(100):
        got = open_at_once(tmp_path / f"log{round_}", (True, False))
        (reader,) = [g for g in got if len(g) != 12]
        assert reader == "reader: []" or reader.startswith(f"LogError: no log at {tmp_path}"), got


def test_a_log_made_before_the_setup_lock_is_still_read(tmp_path: Path) -> None:
    LocalLog(tmp_path / "log").close()
    (tmp_path / "log" / "log.db.setup").unlink()  # as a log of an earlier release has it
    assert open_at_once(tmp_path / "log", (True,)) == ["reader: []"]
