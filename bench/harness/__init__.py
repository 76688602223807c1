"""The bench harness: what every script in bench/ uses, written once.

* `proc`     run a command timed from spawn to exit: wall time, peak RSS, its own CPU (wait4)
             or its whole process tree's CPU (JVM children), a PostgreSQL cluster's CPU.
* `services` throwaway PostgreSQL / Redis / OpenSearch / Kafka from pipelines.devservices,
             started and stopped in one place, and the load-average check.
* `bench`    `Bench`: one run's work dir, PostgreSQL, pipeline files, timed `cdc` commands,
             slots and pg_recvlogical.
* `workload` the 10-column table, its rows and updates, the 70/30 insert/update workload.
* `cdcout`   the numbers `cdc` prints about itself (streamed events, snapshot rows, applied cuts).
* `report`   the side-by-side result: a rich table, the JSON file and the PNG chart.
* `main`     the common command line (--json, --keep), work dir and clean-up.

The scripts run as `.venv/bin/python bench/<name>.py`, which puts bench/ on sys.path, so they
import this package as `harness`.
"""
