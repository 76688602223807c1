"""What a user is shown of an exception raised through Spark: its first meaningful line."""

from __future__ import annotations


def spark_error_line(exc: BaseException) -> str:
    """The first meaningful line of an exception, Java/Py4J stack traces left out."""
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(
            ("at ", "Traceback", "File ", "py4j.", "Caused by: java.lang.reflect")
        ):
            return line[:500]
    return type(exc).__name__
