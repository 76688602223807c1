"""What the JVM dev services (Kafka, Kafka Connect with Debezium, OpenSearch) share: finding
`java`, a log4j2 configuration that writes one size-rolled file, and the tail of their logs
for error messages."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from cdc.ground.errors import ServiceError

# Everything to one file, rolled by size so a long-running dev service cannot fill the disk.
_LOG4J2 = """\
status = warn
name = {name}
shutdownHook = disable
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = {log}
appender.file.filePattern = {log}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
"""


def java_bin(service: str = "this service") -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise ServiceError(
            f"{service} needs a Java runtime and none was found", "install Java 17 (scripts/setup.sh does)"
        )
    return found


def log4j2_properties(name: str, log: Path, levels: Mapping[str, str]) -> str:
    """A log4j2.properties writing to `log`; `levels` sets logger name -> level."""
    lines = [_LOG4J2.format(name=name, log=log)]
    for i, (logger, level) in enumerate(levels.items()):
        lines.append(f"logger.l{i}.name = {logger}\nlogger.l{i}.level = {level}\n")
    return "".join(lines)


def log_tail(paths: Iterable[Path], lines: int = 25) -> str:
    """The last `lines` lines of each file that has any, headed by its name."""
    parts = []
    for path in paths:
        try:
            text = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        if text:
            parts.append(f"--- {path.name} (last {min(lines, len(text))} lines)\n" + "\n".join(text[-lines:]))
    return "\n".join(parts) or "(no log output)"
