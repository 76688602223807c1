"""Crash campaign: "nothing lost, nothing doubled" under random faults at random moments.

N rounds on the local log and N on the Kafka log. A round (bench/chaosing/rounds.py) makes a fresh
database with two tables, runs `cdc run` with four followers (Delta, Iceberg, Redis, tantivy)
under a supervisor that restarts it whenever it exits, writes a random workload (inserts, updates
that keep a TOAST value, deletes, key changes, tiny and big transactions, truncates, columns added
and dropped), and injects random faults: kill -9 of the stream reader, of the whole `cdc run`
(apply included), of the Kafka publisher child; SIGTERM; PostgreSQL restarts (fast and immediate);
Redis and Kafka broker restarts; a stalled Redis; a full disk under the local log. After each
fault it times how long the followers take to pass the source position taken just before it (`cdc
wait --lsn`). At the end it lets the pipeline converge, stops it, and compares every follower with
the source through each engine's own reader (delta-rs, pyiceberg, redis-py, tantivy), plus `cdc
verify`. Each round prints its seed; `--replay SEED --log KIND` runs that round alone.

    .venv/bin/python bench/chaos.py [--rounds 20] [--log local,kafka] [--seconds 90] [--seed 1]
                                    [--faults kill9_stream,...] [--faults-per-round N] [--order kill9_apply,...]
                                    [--replay SEED] [--json out.json] [--keep]

Exit code 0 when every round ended with every follower identical to the source, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

# The independent readers (delta-rs, pyiceberg, redis-py, tantivy) are the test suite's, written
# once in tests/fixtures/readers.py: the repository root must be importable, not only bench/.
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from chaosing.compare import Tally
from chaosing.faults import FAULTS
from chaosing.rounds import RoundResult, Services, log_filesystem, play
from harness.bench import Bench
from harness.main import main
from harness.report import Report
from harness.services import say, started

from pipelines.devservices.kafka import LocalKafka
from pipelines.devservices.redis import LocalRedis


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=20, help="rounds per log kind (default 20)")
    p.add_argument("--log", default="local,kafka", help="log kinds, comma-separated (default local,kafka)")
    p.add_argument("--seconds", type=float, default=90, help="workload and faults per round (default 90)")
    p.add_argument(
        "--seed", type=int, default=1, help="seed of the first round; round i uses seed+i (default 1)"
    )
    p.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"fault kinds to draw from (default all: {','.join(FAULTS)})",
    )
    p.add_argument(
        "--faults-per-round",
        type=int,
        help="inject exactly this many faults per round, however long they take (default: as many as --seconds allows)",
    )
    p.add_argument(
        "--order",
        help="inject exactly these faults in this order (comma-separated), at moments drawn from the seed "
        "(tests/integration/test_chaos.py's rounds)",
    )
    p.add_argument(
        "--replay", type=int, help="run only the round with this seed (with --log naming one kind)"
    )
    return p


def check(args: argparse.Namespace) -> str | None:
    unknown = (set(args.faults.split(",")) | set(args.order.split(",") if args.order else ())) - set(FAULTS)
    if unknown:
        return f"unknown fault kinds {sorted(unknown)}; known: {', '.join(FAULTS)}"
    if set(args.log.split(",")) - {"local", "kafka"}:
        return "--log takes local, kafka or local,kafka"
    if args.replay is not None and "," in args.log:
        return "--replay runs one round: name its log kind with --log local or --log kafka"
    return None


def body(b: Bench) -> Report:
    args = b.args
    kinds = args.log.split(",")
    b.start_postgres(durable=True)
    redis = started(b.stack, LocalRedis(b.work / "redis"), "Redis")
    kafka = started(b.stack, LocalKafka(b.work / "kafka", heap="1g"), "Kafka") if "kafka" in kinds else None
    logfs = b.stack.enter_context(log_filesystem(b.work / "logfs"))
    services = Services(b.pg, redis, kafka, logfs)
    faults = args.faults.split(",")
    order = args.order.split(",") if args.order else None
    plan = (
        [(kinds[0], args.replay)]
        if args.replay is not None
        else [(k, args.seed + i) for i in range(args.rounds) for k in kinds]  # local, kafka, local, ...
    )
    results: list[RoundResult] = []
    for kind, seed in plan:
        result = play(
            b.work, services, kind, seed, args.seconds, faults, count=args.faults_per_round, order=order
        )
        results.append(result)
        if not result.clean:
            args.keep = True  # the work dir holds what the round kept to look at
        say(f"  round {seed} ({kind}): {_outcome(result)}")
        b.load(f"after round {seed} ({kind})")
        b.results["rounds"] = [_as_json(r) for r in results]
        if args.json:  # after every round: a campaign stopped early keeps what it found
            args.json.write_text(json.dumps(b.results, indent=2, default=str) + "\n")
    return report(results)


def _total(results: list[RoundResult]) -> Tally:
    """Every follower's tally of these rounds added up."""
    total = Tally()
    for r in results:
        for t in r.tallies.values():
            total.add(t)
    return total


def _outcome(r: RoundResult) -> str:
    total = _total([r])
    return (
        f"{'clean' if r.clean else 'FINDING'}; {len(r.faults)} faults; {total.compared:,} rows compared "
        f"(3 followers): lost {total.lost}, doubled {total.doubled}, stale {total.stale}, "
        f"not deleted {total.extra}; verify exit {r.verify_code}" + (f"; error: {r.error}" if r.error else "")
    )


def _as_json(r: RoundResult) -> dict:
    return {
        "seed": r.seed, "log": r.log, "clean": r.clean, "error": r.error, "verify": r.verify_code,
        "faults": r.faults, "workload": r.workload, "rolled_back": r.rolled_back, "run_exits": r.run_exits,
        "followers": {k: {**vars(t)} for k, t in r.tallies.items()},
    }  # fmt: skip


def report(results: list[RoundResult]) -> Report:
    rep = Report(
        "Crash campaign: time for the followers to pass the position before each fault", ("n", "p99", "max")
    )
    for log in dict.fromkeys(r.log for r in results):
        mine = [r for r in results if r.log == log]
        by_kind: dict[str, list[float | None]] = {}
        for r in mine:
            for kind, took in r.faults:
                by_kind.setdefault(kind, []).append(took)
        for kind, times in sorted(by_kind.items()):
            done = sorted(t for t in times if t is not None)
            if not done:
                continue
            p99 = done[min(len(done) - 1, int(0.99 * len(done)))]
            missed = len(times) - len(done)
            rep.add(
                log, kind, statistics.median(done), "s (p50)", less_is_better=True,
                n=str(len(times)), p99=f"{p99:.1f} s", max=f"{done[-1]:.1f} s",
                notes=f"{missed} did not converge" if missed else "",
            )  # fmt: skip
        total = _total(mine)
        bad = [r.seed for r in mine if not r.clean]
        rep.summary.append(
            f"{log} log: {len(mine)} rounds, {sum(len(r.faults) for r in mine)} faults, "
            f"{total.compared:,} rows compared (3 followers), lost {total.lost}, doubled {total.doubled}, "
            f"stale {total.stale}, not deleted {total.extra}; verify failed in {sum(r.verify_code != 0 for r in mine)}; "
            f"rounds with a finding: {bad or 'none'}"
        )
    rep.subtitle = "faults injected one at a time into a running `cdc run`, workload running throughout"
    return rep


if __name__ == "__main__":
    outcome: list[bool] = []

    def run(b: Bench) -> Report:
        rep = body(b)
        outcome.append(all(r["clean"] for r in b.results["rounds"]))
        return rep

    code = main(parser(), run, prefix="chaos", check=check)
    with contextlib.suppress(IndexError):
        code = code or (0 if outcome[0] else 1)
    sys.exit(code)
