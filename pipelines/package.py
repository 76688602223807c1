"""The spark-submit package: the code zip (pipelines/codezip.py), the entry script and the
driver's log4j settings (docs/cluster.md).

`cdc package spark --out DIR` writes DIR/pgcdc.zip and DIR/cdc_apply.py and prints the
spark-submit command with the jars it needs. `cdc apply` on a non-local master ships the same zip
by itself (pipelines/spark.py ship_code), so executors never need the project installed; they do
need its third-party libraries (docs/cluster.md: the executors' Python).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from cdc.ground.private import private_dir
from pipelines.codezip import ZIP_NAME, write_zip

ENTRY_NAME = "cdc_apply.py"
LOG4J_NAME = "log4j2.properties"

# The spark-submit entry: `cdc apply` with the session spark-submit created (pipelines/spark.py
# reuses its JVM and keeps its --master/--conf/--jars).
ENTRY = '''"""spark-submit entry of pgcdc: `spark-submit ... cdc_apply.py PIPELINE [--once] [--sink NAME]`
runs `cdc apply` (same options, exit codes and output) on the application spark-submit started."""

import sys

from pipelines.cli import cli

if __name__ == "__main__":
    cli(["apply", *sys.argv[1:]], prog_name="cdc_apply.py")
'''


def spark_jar_paths() -> list[str]:
    from pipelines.spark import SPARK_JAR_GROUPS, jars_dir, spark_jars

    return spark_jars(tuple(g for g in SPARK_JAR_GROUPS if (jars_dir() / g).exists()) or ("spark",))


def build(out_dir: Path) -> tuple[Path, Path]:
    """DIR/pgcdc.zip, DIR/cdc_apply.py and DIR/log4j2.properties."""
    from pipelines.spark import SPARK_CONF_DIR

    private_dir(out_dir)
    entry = out_dir / ENTRY_NAME
    entry.write_text(ENTRY)
    # the driver's log4j settings (errors only), as `cdc apply` has them: a file, not in the zip
    (out_dir / LOG4J_NAME).write_text((SPARK_CONF_DIR / LOG4J_NAME).read_text())
    return write_zip(out_dir / ZIP_NAME), entry


def submit_command(out_dir: Path, master: str = "spark://HOST:7077", pipeline: str = "PIPELINE") -> str:
    """The spark-submit line for a package in out_dir: the code zip, the Delta/Kafka jars, the
    Delta SQL extension (it must be on before the session exists) and this Python."""
    import sys

    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    argv = [
        str(submit),
        "--master", master,
        "--name", "cdc-apply",
        "--jars", ",".join(spark_jar_paths()),
        "--py-files", str(out_dir.resolve() / ZIP_NAME),
        "--conf", "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
        "--conf", "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "--conf", f"spark.pyspark.python={sys.executable}",
        "--driver-java-options", f"-Dlog4j2.configurationFile=file:{out_dir.resolve() / LOG4J_NAME}",
        str(out_dir.resolve() / ENTRY_NAME),
        pipeline,
        "--once",
    ]  # fmt: skip
    return " ".join(shlex.quote(a) if a != pipeline else a for a in argv)
