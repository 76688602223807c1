"""Where the executors' Python workers find the sinks' secrets (cdc/ground/executor_secrets.py;
docs/cluster.md, secrets on the executors).

The task functions carry SecretRefs (variable names). Before a job that needs them, a sink calls
`provide`:

* local master: the values go into `SparkContext.environment`, the variables pyspark hands the
  Python workers it starts on this machine;
* any other master: they are taken out of it (pyspark copies every `spark.executorEnv.*` there,
  and would then send them with each task's function): executors got them at launch from
  `spark.executorEnv.*` (pipelines/spark.py) or from the workers' own environment.

`SparkContext.environment` is replaced, never changed in place: sinks run in several driver
threads, and another thread may be turning the old dict into a task's function right now.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from cdc.ground.errors import EngineSettingError
from cdc.ground.executor_secrets import MISSING, SecretRef

if TYPE_CHECKING:
    from pyspark import SparkContext


def is_local(sc: SparkContext) -> bool:
    return (sc.master or "").startswith("local")


def provide(spark: Any, refs: Iterable[SecretRef]) -> None:
    """Make the secrets of `refs` readable from the environment of the executors' Python workers."""
    if spark is None:
        return
    sc = spark.sparkContext
    env = dict(sc.environment)
    for ref in refs:
        if is_local(sc):
            value = ref.peek()
            if value is not None:
                env[ref.var] = value
        else:
            env.pop(ref.var, None)
    if env != sc.environment:
        sc.environment = env


def keep_out_of_tasks(sc: SparkContext, names: Iterable[str]) -> None:
    """On a cluster: the executors have these from launch; no task's function carries them."""
    if is_local(sc):
        return
    env = {k: v for k, v in sc.environment.items() if k not in set(names)}
    if env != sc.environment:
        sc.environment = env


def missing_error(problem: str, sink: str) -> EngineSettingError | None:
    """An executor's ExecutorSecretMissing, found in the text of its failure, as exit 3."""
    at = problem.find(MISSING)
    if at < 0:
        return None
    var = problem[at + len(MISSING) :].split()[0]
    return EngineSettingError(
        f"sink {sink}: {MISSING}{var}, the secret its executors need",
        f"with spark.executor_secrets: workers, export {var} in every worker's environment "
        "(conf/spark-env.sh) and restart the workers; with conf (the default) the driver sets "
        f"spark.executorEnv.{var} when it builds the session: run the job with `cdc apply` or the "
        "cdc_apply.py of `cdc package spark`",
    )
