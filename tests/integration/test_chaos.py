"""The crash campaign's slice in the suite (issue 18; README Guarantees, bench/README.md).

Two rounds of `bench/chaos.py` (the Kafka one only with CDC_CHAOS_KAFKA=1) with fixed seeds, injecting a fixed number of faults (the
seed picks their kinds and order) into a running `cdc run` while a random workload writes: on the
local log seed 6 draws kill -9 of the whole run (apply loop, Spark's JVM, stream child), an
immediate PostgreSQL shutdown (crash recovery), SIGTERM and a full disk under the log; on the
Kafka log seed 4 draws kill -9 of the whole run, a broker restart, kill -9 again and kill -9 of
the publisher child. Every follower (Delta, Redis, tantivy) is then compared with the source row
by row through its engine's own reader (delta-rs, redis-py, tantivy's searcher), and `cdc verify`
must exit 0. A failing round prints its replay command:
`bench/chaos.py --replay SEED --log KIND --faults-per-round 4`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.devservices.postgres import LocalPostgres
from tests.fixtures.services import postgres

# The campaign is bench code (one harness for the benchmark and this slice): bench/ is its root.
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))  # last: shadows nothing

from chaosing.faults import FAULTS
from chaosing.rounds import Services, log_filesystem, play

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAULTS_PER_ROUND = 4


@pytest.fixture(scope="module")
def chaos_pg() -> Iterator[LocalPostgres]:
    """A server of the module's own: the rounds shut it down and start it again."""
    with postgres("cdc-test-chaos-pg-") as server:
        yield server


ROUNDS = {
    ("local", 6): ["kill9_apply", "pg_restart_immediate", "sigterm_run", "disk_full"],
    # The Kafka round (seed 4: kill -9 of the run twice, a broker restart, kill -9 of the publisher)
    # passed, but took 9-25 minutes, mostly waiting after the broker restart: out of the suite until
    # that wait is understood; run it with CDC_CHAOS_KAFKA=1 or bench/chaos.py --replay 4 --log kafka.
    **(
        {("kafka", 4): ["kill9_apply", "kafka_restart", "kill9_apply", "kill9_publisher"]}
        if os.environ.get("CDC_CHAOS_KAFKA")
        else {}
    ),
}


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("log", "seed"), list(ROUNDS))
def test_round_of_random_faults_leaves_every_follower_identical(
    log: str, seed: int, chaos_pg: LocalPostgres, own_redis, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    kafka = request.getfixturevalue("kafka") if log == "kafka" else None  # the session broker, restarted
    with log_filesystem(tmp_path / "logfs") as logfs:
        services = Services(chaos_pg, own_redis, kafka, logfs)
        result = play(tmp_path, services, log, seed, 0, list(FAULTS), count=FAULTS_PER_ROUND)

    replay = f"bench/chaos.py --replay {seed} --log {log} --faults-per-round {FAULTS_PER_ROUND}"
    assert result.error is None, f"{result.error} (replay: {replay})"
    assert [kind for kind, _ in result.faults] == ROUNDS[log, seed]
    assert all(took is not None for _, took in result.faults), f"a fault did not converge: {result.faults}"
    assert sum(result.workload.values()) > 0, "the workload wrote nothing"
    for follower, tally in result.tallies.items():
        assert tally.compared > 0, f"{follower}: no rows compared"
        assert tally.clean, f"{follower}: {vars(tally)} (replay: {replay})"
    assert set(result.tallies) == {"delta", "redis", "tantivy"}
    assert result.verify_code == 0, f"cdc verify exited {result.verify_code} (replay: {replay})"
