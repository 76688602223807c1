"""What a Spark session starts with (issue 37 item 6, pipelines/spark.py, pipelines/jvmarchive.py):
only the jar groups the pipeline needs, and the class archive's key, folder and choices. The JVM's
own use of an archive (made, mapped, a stale one ignored) is tests/integration/test_spark_state.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.jvmarchive import (
    DYNAMIC_MAGIC,
    Archive,
    archive_key,
    chooses_own,
    keep,
    layout_options,
    main,
    prune,
)
from pipelines.spark import SPARK_CONF_DIR, SPARK_JAR_GROUPS, _conf_dir, empty_conf_dir, pipeline_jar_groups
from sinks.registry import parse_pipeline

pytestmark = pytest.mark.unit

SOURCE = {"postgres": {"dsn": "postgresql://u@127.0.0.1/d", "tables": ["public.t"]}}


def groups(**sections: object) -> tuple[str, ...]:
    return pipeline_jar_groups(parse_pipeline({"name": "p", "source": SOURCE, **sections}))


def test_a_pipeline_loads_only_the_jars_its_log_and_followers_need() -> None:
    lake = {"name": "lake", "delta": {"path": "lake"}}
    ice = {"name": "ice", "iceberg": {"warehouse": "ice"}}
    kafka = {"kafka": {"bootstrap_servers": "127.0.0.1:9092"}}
    assert groups(sinks=[lake]) == ("spark",)  # a local log into Delta: no Kafka, no Iceberg runtime
    assert groups(sinks=[lake, ice]) == ("spark", "iceberg")
    assert groups(sinks=[lake], log=kafka) == ("spark", "spark-kafka")
    assert groups(sinks=[ice], log=kafka) == ("spark", "spark-kafka", "iceberg")
    assert pipeline_jar_groups(None) == SPARK_JAR_GROUPS  # no pipeline (a test session): every group


def test_the_archive_key_follows_the_class_path(tmp_path: Path) -> None:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_bytes(b"java")
    jar = tmp_path / "a.jar"
    jar.write_bytes(b"one")
    key = archive_key(java, [jar])
    assert archive_key(java, [jar]) == key  # stable: later starts find the archive
    os.utime(jar, ns=(1, 1))
    assert archive_key(java, [jar]) != key  # a jar replaced in place (same name): another archive
    assert archive_key(java, [jar, tmp_path / "b.jar"]) != archive_key(java, [jar])
    assert archive_key(java, [jar], ["heap=64g"]) != archive_key(java, [jar])


def test_only_pointer_layout_options_make_another_archive() -> None:
    plain = layout_options(["-Dderby.system.home=/s/spark/derby -XX:TieredStopAtLevel=1"], None)
    assert plain == layout_options(["-Dderby.system.home=/other"], None)  # one archive for every pipeline
    assert layout_options(["-XX:-UseCompressedOops"], None) != plain
    assert layout_options([""], "64g") != plain


def test_the_users_own_class_sharing_flags_win() -> None:
    assert chooses_own(["-Xshare:off"])
    assert chooses_own(["-XX:SharedArchiveFile=/x.jsa"])
    assert not chooses_own(["-XX:ReservedCodeCacheSize=240m -XX:TieredStopAtLevel=1", ""])


def test_made_at_exit_into_a_file_of_its_own_then_mapped(tmp_path: Path) -> None:
    archive = Archive(tmp_path / "jvm", "k")
    assert archive.java_options(make=False) == ""  # a long-running verb makes none
    making = archive.java_options()
    assert f"-XX:ArchiveClassesAtExit={tmp_path / 'jvm' / f'k.{os.getpid()}.part'}" in making
    assert "-Xlog:cds*=off" in making  # CDS's warnings would go to the verb's stdout
    assert (tmp_path / "jvm").stat().st_mode & 0o777 == 0o700  # the JVM maps it: owner-only
    assert archive.making is not None and not archive.finish(None)  # no JVM of ours: nothing to keep
    made = tmp_path / "jvm" / "k.1.part"
    made.write_bytes(DYNAMIC_MAGIC.to_bytes(4, "little") + b"classes")
    assert keep(made, archive.stem)
    kept = tmp_path / "jvm" / "k-11.jsa"  # named with the size it was made with
    assert Archive(tmp_path / "jvm", "k").java_options() == f"-XX:SharedArchiveFile={kept} -Xlog:cds*=off"


def test_an_archive_cut_short_is_deleted_not_mapped(tmp_path: Path) -> None:
    """HotSpot maps a truncated archive and dies on SIGBUS (seen with JDK 17) instead of refusing it."""
    made = tmp_path / "k.1.part"
    made.write_bytes(DYNAMIC_MAGIC.to_bytes(4, "little") + bytes(100))
    assert keep(made, tmp_path / "k")
    kept = tmp_path / "k-104.jsa"
    kept.write_bytes(kept.read_bytes()[:50])  # a full disk, a partial copy
    archive = Archive(tmp_path, "k")
    assert archive.found() is None and not kept.exists()
    assert "-XX:ArchiveClassesAtExit=" in archive.java_options()  # made again


def test_prune_keeps_the_most_recently_used(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"{i}.jsa").write_bytes(b"x")
        os.utime(tmp_path / f"{i}.jsa", (1000 + i, 1000 + i))
    (tmp_path / "old.jsa.1.part").write_bytes(b"x")
    os.utime(tmp_path / "old.jsa.1.part", (1, 1))
    (tmp_path / "new.jsa.2.part").write_bytes(b"x")  # another process writing it now
    (tmp_path / "conf").mkdir()
    prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.jsa", "4.jsa", "conf", "new.jsa.2.part"]


def test_spark_conf_dir_for_the_launch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert empty_conf_dir() == tmp_path / "cdc" / "jvm" / "conf"
    archive = Archive(tmp_path, "k")
    assert _conf_dir(archive) == str(empty_conf_dir())  # a directory with files would rule it out
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    assert _conf_dir(None) == str(SPARK_CONF_DIR)  # ours: log4j errors only
    monkeypatch.setenv("SPARK_CONF_DIR", str(empty_conf_dir()))  # a parent cdc's, inherited
    assert _conf_dir(None) == str(SPARK_CONF_DIR)
    monkeypatch.setenv("SPARK_CONF_DIR", "/etc/spark")
    assert _conf_dir(None) == "/etc/spark"  # the user's own


def test_only_a_whole_archive_is_put_in_place(tmp_path: Path) -> None:
    """HotSpot writes the header (its magic number first) last: a file without it was not finished."""
    cut_short = tmp_path / "k.1.part"
    cut_short.write_bytes(bytes(4096))
    assert not keep(cut_short, tmp_path / "k") and list(tmp_path.iterdir()) == []
    older = tmp_path / "k-3.jsa"
    older.write_bytes(b"old")
    made = tmp_path / "k.2.part"
    made.write_bytes(DYNAMIC_MAGIC.to_bytes(4, "little") + b"rest")
    assert keep(made, tmp_path / "k")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k-8.jsa"]  # the key's older one replaced


def test_the_watcher_keeps_the_archive_once_the_jvm_is_gone(tmp_path: Path) -> None:
    """A JVM still writing when the verb stops waiting: `python -m pipelines.jvmarchive PID PART STEM`."""
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    made = tmp_path / "k.3.part"
    made.write_bytes(DYNAMIC_MAGIC.to_bytes(4, "little"))
    assert main([str(gone.pid), str(made), str(tmp_path / "k")]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["k-4.jsa"]
