"""Scheduled apply of pgcdc pipelines with Apache Airflow 3 (README "Scheduling").

Copy this file into Airflow's dags folder. It defines two DAGs:

  cdc_apply        every 10 minutes (env CDC_APPLY_SCHEDULE, a cron line or preset): for each
                   pipeline file, `cdc apply FILE --once` (task `apply`), then `cdc status FILE
                   --json` checked against the lag thresholds (task `check_lag`, runs even when
                   `apply` failed, so a follower that stays behind raises the alert): each
                   follower's lag, and the slot's (the log behind the source, no stream reading it).
  cdc_log_compact  daily (env CDC_COMPACT_SCHEDULE): `cdc log compact FILE --tombstone-retention R`.

`cdc stream` runs continuously elsewhere (a systemd service); these DAGs only apply and compact.

Airflow Variables (set in the UI, with `airflow variables set`, or as environment variables
AIRFLOW_VAR_<NAME in capitals> on the workers):

  cdc_pipelines             pipeline files: a JSON list, or paths separated by commas or new
                            lines; relative paths are relative to this file's folder.
                            Default: pipeline.yml beside this file.
  cdc_bin                   the cdc executable. Default: `cdc` on the worker's PATH.
  cdc_max_lag_s             lag alert: fail `check_lag` when a follower's lag_s (seconds since
                            the source committed the oldest change it has not applied) is above
                            this. Default 900.
  cdc_max_slot_lag_bytes    slot lag alert: fail `check_lag` when the replication slot's lag_bytes
                            (WAL the source wrote that the log does not hold yet) is above this,
                            when no stream reads the slot, or when the slot or source cannot be
                            read. Default 256000000 (as the PgcdcSlotLagHigh alert rule).
  cdc_tombstone_retention   `--tombstone-retention` of the compaction. Default 24h.

A non-zero exit of `cdc` fails the task with what the exit code means (`EXIT_CODES`) and the
command's own `error:` / `fix:` lines. `on_failure_callback` (`alert`) is where a Slack or e-mail
notifier goes; as shipped it logs one `CDC ALERT` line.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
from collections import deque
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, BaseOperator, TriggerRule, Variable, task
from airflow.sdk.exceptions import AirflowException

HERE = Path(__file__).resolve().parent

# The exit codes of `cdc` (README "CLI reference"), in words for the task's failure message.
EXIT_CODES: dict[int, str] = {
    1: "a follower differs from the source, or is not there yet",
    2: "bad usage or a bad pipeline file: nothing was done; fix what the error:/fix: lines say",
    3: "the source is not usable as configured (unreachable, wal_level, rights, replication slot "
    "missing or in use, a missing table or key; or a Redis follower whose maxmemory-policy may evict)",
    4: "runtime failure (a follower unreachable or failing, data lost with on_lost: stop, an "
    "unreadable checkpoint, or another cdc apply holding the sink); the next run re-applies the cut",
    130: "interrupted before it finished (the task was stopped or timed out); the next run resumes",
    141: "its output was closed before it finished (SIGPIPE)",
}


def exit_meaning(code: int) -> str:
    if code < 0:  # subprocess: killed by a signal
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"killed by signal {name} (the task's timeout, the OOM killer or an operator)"
    return EXIT_CODES.get(code, "unexpected exit code")


def setting(name: str, default: str) -> str:
    """An Airflow Variable (AIRFLOW_VAR_<NAME> in the environment counts), else the default."""
    value = Variable.get(name, default=None)
    return default if value in (None, "") else str(value)


def pipeline_files() -> list[str]:
    raw = setting("cdc_pipelines", "pipeline.yml").strip()
    names = json.loads(raw) if raw.startswith("[") else raw.replace("\n", ",").split(",")
    return [str(HERE / n.strip()) for n in names if n.strip()]  # an absolute path stays as it is


def cdc_executable() -> str:
    name = setting("cdc_bin", "cdc")
    found = shutil.which(name)
    if found is None:
        raise AirflowException(
            f"the cdc executable {name!r} was not found on this worker; "
            "set the Airflow Variable cdc_bin to its path (e.g. /opt/pgcdc/.venv/bin/cdc)"
        )
    return found


class CdcCommand(BaseOperator):
    """Runs `cdc VERB... PIPELINE OPTIONS...`; its output goes to the task log. A non-zero exit
    fails the task with the exit code's meaning and the command's error:/fix: lines."""

    template_fields = ("pipeline", "options")

    def __init__(self, *, verb: list[str], pipeline: str, options: list[str] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.verb = verb
        self.pipeline = pipeline
        self.options = options or []
        self._child: subprocess.Popen[str] | None = None

    def command(self) -> list[str]:
        return [cdc_executable(), *self.verb, self.pipeline, *self.options]

    def run_cdc(self, args: list[str], json_out: bool = False) -> str:
        """Run it; returns stdout. With json_out, stdout is kept apart from the messages (stderr);
        otherwise both go to the task log line by line as they come."""
        self.log.info("running %s", shlex.join(args))
        # cwd: the pipeline file's folder, so relative paths in fix lines work as printed
        self._child = child = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if json_out else subprocess.STDOUT,
            text=True,
            cwd=Path(self.pipeline).parent,
        )
        out, tail = "", deque[str](maxlen=200)  # the last lines: where error:/fix: are
        try:
            if json_out:
                out, err = child.communicate()
                tail.extend(err.splitlines())
                for line in tail:
                    self.log.info("%s", line)
            else:
                assert child.stdout is not None
                for line in child.stdout:
                    self.log.info("%s", line.rstrip())
                    tail.append(line.rstrip())
                child.wait()
        finally:  # the task stopped (its timeout): stop cdc too, it ends its batch on SIGTERM
            if child.poll() is None:
                child.terminate()
                child.wait(timeout=120)
        if child.returncode != 0:
            # cdc's own words: `error:` lines, a failed sink of `cdc apply`, their `fix:` lines
            said = [s.strip() for s in tail if s.strip().startswith(("error:", "fix:")) or ": FAILED: " in s]
            raise AirflowException(
                f"`{shlex.join(['cdc', *self.verb, self.pipeline, *self.options])}` exited {child.returncode}: "
                f"{exit_meaning(child.returncode)}" + "".join(f"\n  {s}" for s in said[-6:])
            )
        return out

    def execute(self, context: Any) -> None:
        self.run_cdc(self.command())

    def on_kill(self) -> None:
        # SIGTERM: `cdc apply --once` stops (exit 130) and the next run re-applies the open cut
        if self._child is not None and self._child.poll() is None:
            self._child.terminate()


def lagging_followers(status: dict[str, Any], max_lag_s: float) -> list[str]:
    """What the lag alert reports from `cdc status --json`: followers whose lag_s is above the
    threshold, whose checkpoint is unreadable, or that stopped after losing data."""
    problems = []
    for f in status.get("followers", []):
        name = f"follower {f['sink']} ({f['kind']}) of pipeline {status.get('pipeline')}"
        if "error" in f:
            problems.append(f"{name}: {f['error']}; fix: {f.get('fix')}")
        elif (f.get("lost") or {}).get("action") == "stopped":
            problems.append(f"{name}: lost data, apply stopped; fix: {f['lost'].get('fix')}")
        elif f.get("lag_s") is not None and f["lag_s"] > max_lag_s:
            problems.append(
                f"{name}: lag {f['lag_s']:g}s > {max_lag_s:g}s "
                f"({f.get('events_behind_log')} events behind the log)"
            )
    return problems


def lagging_slot(status: dict[str, Any], max_slot_lag_bytes: float) -> list[str]:
    """What the lag alert reports about the slot: the log too far behind the source, no stream
    reading it (`cdc stream` dead: the source keeps WAL for it), or the slot or source unreadable."""
    name = f"slot {status.get('slot')} of pipeline {status.get('pipeline')}"
    source = status.get("source") or {}
    if "error" in source:
        return [f"{name}: cannot read the source: {source['error']}"]
    slot = source.get("slot")
    if slot is None:
        return [f"{name}: the slot does not exist (run `cdc snapshot` or `cdc run` to create it)"]
    problems = []
    if slot.get("lag_bytes") is not None and slot["lag_bytes"] > max_slot_lag_bytes:
        problems.append(f"{name}: lag {slot['lag_bytes']:,} bytes > {max_slot_lag_bytes:,.0f} bytes of WAL")
    if not slot.get("active_pid"):
        problems.append(
            f"{name}: no stream reads it (is `cdc stream` running?); it retains "
            f"{slot.get('retained_wal_bytes') or 0:,} bytes of WAL on the source"
        )
    return problems


class CdcLagCheck(CdcCommand):
    """`cdc status PIPELINE --json`; fails (the lag alert) when a follower lags too far."""

    def __init__(self, *, pipeline: str, **kwargs: Any):
        super().__init__(verb=["status"], pipeline=pipeline, options=["--json"], **kwargs)

    def execute(self, context: Any) -> None:
        max_lag_s = float(setting("cdc_max_lag_s", "900"))
        max_slot_lag = float(setting("cdc_max_slot_lag_bytes", "256000000"))
        # exit 4 (a checkpoint cannot be read) fails here with the status command's own lines
        status = json.loads(self.run_cdc(self.command(), json_out=True))
        for f in status.get("followers", []):
            self.log.info(
                "follower %s: lag_s %s, events_behind_log %s",
                f["sink"],
                f.get("lag_s"),
                f.get("events_behind_log"),
            )
        slot = (status.get("source") or {}).get("slot") or {}
        self.log.info(
            "slot %s: lag_bytes %s, active %s",
            status.get("slot"),
            slot.get("lag_bytes"),
            bool(slot.get("active_pid")),
        )
        problems = lagging_slot(status, max_slot_lag) + lagging_followers(status, max_lag_s)
        if problems:
            raise AirflowException("CDC LAG ALERT: " + "; ".join(problems))


def alert(context: Any) -> None:
    """on_failure_callback: replace the body with your notifier (Slack, e-mail, PagerDuty...)."""
    ti = context["ti"]
    print(f"CDC ALERT: {ti.dag_id}.{ti.task_id}[{ti.map_index}] failed: {context.get('exception')}")


@task
def pipelines() -> list[str]:
    files = pipeline_files()
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise AirflowException(
            f"pipeline file(s) not found: {', '.join(missing)}; set the Airflow Variable cdc_pipelines"
        )
    return files


DEFAULTS: dict[str, Any] = {
    "owner": "data-platform",
    # no retries: `cdc apply --once` is idempotent and the next scheduled run catches up
    "retries": 0,
    "on_failure_callback": alert,
}
START = pendulum.datetime(2026, 1, 1, tz="UTC")

with DAG(
    dag_id="cdc_apply",
    schedule=os.environ.get("CDC_APPLY_SCHEDULE", "*/10 * * * *"),
    start_date=START,
    catchup=False,
    max_active_runs=1,  # runs never overlap (cdc apply also locks each sink)
    default_args=DEFAULTS,
    tags=["cdc"],
    doc_md=__doc__,
):
    files = pipelines()
    applied = CdcCommand.partial(
        task_id="apply",
        verb=["apply"],
        options=["--once"],
        execution_timeout=pendulum.duration(minutes=int(os.environ.get("CDC_APPLY_TIMEOUT_MIN", "60"))),
    ).expand(pipeline=files)
    checked = CdcLagCheck.partial(task_id="check_lag", trigger_rule=TriggerRule.ALL_DONE).expand(
        pipeline=files
    )
    applied >> checked

with DAG(
    dag_id="cdc_log_compact",
    schedule=os.environ.get("CDC_COMPACT_SCHEDULE", "@daily"),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULTS,
    tags=["cdc"],
    doc_md=__doc__,
):
    CdcCommand.partial(
        task_id="compact",
        verb=["log", "compact"],
        options=["--tombstone-retention", "{{ var.value.get('cdc_tombstone_retention', '24h') }}"],
    ).expand(pipeline=pipelines())
