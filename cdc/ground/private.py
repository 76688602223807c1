"""Owner-only state: every directory and file the tool creates for its own state (state_dir, the
local log and its segments, snapshot segments, checkpoints, locks, re-base and Debezium state,
verify's source copies) is made here, 0700 directories and 0600 files whatever the umask.

Captured rows are the source's data; a umask of 022 (the usual one) would leave them readable by
every local user. Modes are set explicitly (mkdir/open modes, then chmod) because the umask can
only take bits away, and a 0000 or 0002 umask would otherwise give group or world access.
Directories that already exist are left as they are (the operator may share them on purpose);
`cdc validate` warns when state_dir is group or world readable.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO, Any

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: str | os.PathLike[str]) -> Path:
    """`mkdir -p path`, each directory created here 0700 (existing ones untouched)."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:  # another process made it meanwhile
            continue
        os.chmod(d, DIR_MODE)  # the umask may have taken owner bits away
    return path


def private_open(path: str | os.PathLike[str], mode: str = "wb", **kwargs: Any) -> IO[Any]:
    """open(path, mode) for writing ('w', 'wb', 'a', 'ab', 'r+'...), the file 0600 from its
    first byte (created so, or an existing file narrowed before anything is written)."""
    flags = os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_RDWR if "+" in mode or "r" in mode else os.O_WRONLY
    if "w" in mode:
        flags |= os.O_TRUNC
    if "a" in mode:
        flags |= os.O_APPEND
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def private_fd(path: str | os.PathLike[str], flags: int = os.O_RDWR) -> int:
    """os.open(path, flags | O_CREAT) with the file 0600 (lock files)."""
    fd = os.open(path, flags | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def private_file(path: str | os.PathLike[str]) -> Path:
    """Create an empty 0600 file if missing, for files another library then opens (SQLite makes
    its -wal/-shm/-journal files with the database file's mode)."""
    os.close(private_fd(path, os.O_RDONLY))
    return Path(path)


def private_tree(path: str | os.PathLike[str]) -> None:
    """Narrow a tree written by a library that honours only the umask (tantivy) to 0700/0600."""
    root = Path(path)
    if not root.exists():
        return
    os.chmod(root, DIR_MODE)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), DIR_MODE)
        for name in filenames:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, FILE_MODE)


def exposed(path: str | os.PathLike[str]) -> str | None:
    """'group/world readable (mode 0755)' when an existing directory or file lets others in, else None."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    if mode & 0o077 == 0:
        return None
    who = " and ".join(w for w, bits in (("group", 0o070), ("world", 0o007)) if mode & bits)
    return f"{who} can read or enter it (mode {mode:04o})"
