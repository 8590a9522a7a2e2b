"""Files shardbench keeps, written so that nothing already written is lost, and names that come
from data, made safe to put in a path.

- ``path_component``: the one way a value from a record, a history line, a suite or rules file
  or a flag becomes part of a path. It refuses what would climb out of a folder (separators,
  ``..``, an absolute path), replaces any other character outside ``[A-Za-z0-9._=-]``, and caps
  the length: a long value (an ``hf:`` preset of a dozen keys) keeps a readable prefix and a hash
  of the whole, so two long values never share a name; the full text stays in the record.
- ``inside``: the final path, checked to lie inside the root it was meant for.
- ``atomic_write_text``: a temporary file in the same folder, flushed to disk, then renamed over
  the target. A failure at any point (a full disk, a signal) leaves the old file as it was.
- ``file_lock``: an exclusive lock for a read-modify-write (a history, a baseline), on a
  ``.lock`` file beside the target, since the target itself is replaced by a rename.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: longest path component we make (file systems allow 255 bytes; prefixes and suffixes are added)
MAX_COMPONENT = 96
_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]+")


def path_component(
    value: object, *, what: str = "name", limit: int = MAX_COMPONENT, separators: str = "refuse"
) -> str:
    """``value`` as one safe path component (see the module docstring); ``what`` names the value
    in the error when it is refused. ``separators="replace"`` is for names composed of several
    values (a chart of ``examples/net.py:factory``): there a separator becomes ``_`` too."""
    text = str(value)
    if separators == "replace":
        text = text.replace("/", "_").replace("\\", "_")
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\x00" in text:
        raise ValueError(
            f"{what} {text!r} cannot name a file or folder: it is empty, '.', '..' or holds a path "
            "separator (allowed: letters, digits and . _ = -; other characters become _)"
        )
    safe = _UNSAFE.sub("_", text).strip("_") or "_"
    if safe.startswith("."):  # no hidden files, no '..' made of replaced characters
        safe = "_" + safe
    if len(safe) > limit:
        digest = hashlib.sha1(text.encode()).hexdigest()[:12]
        safe = f"{safe[: limit - len(digest) - 1]}-{digest}"
    return safe


def results_home(root: Path | None = None) -> Path:
    """Where saved baselines (``baselines/``) and nightly histories (``history/``) live: ``root``
    when given (``--root``), else ``$SHARDBENCH_HOME``, else ``./results`` in the directory the
    command runs in. Never inside the installed package: a user's results are theirs."""
    return Path(root or os.environ.get("SHARDBENCH_HOME") or "results")


def history_file(suite: str, root: Path | None = None) -> Path:
    """A suite's nightly history, where ``nightly`` appends one line per cell per night unless
    given ``--history``: ``history/<suite>.jsonl`` in the results home."""
    return results_home(root) / "history" / f"{path_component(suite, what='suite name')}.jsonl"


def inside(root: Path, *components: str) -> Path:
    """``root / components...``, refused unless it resolves to a place inside ``root``."""
    base = Path(root).resolve()
    path = base.joinpath(*components).resolve()
    if path != base and base not in path.parents:
        raise ValueError(f"{path} is outside {base}")
    return path


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text`` all at once, or not at all."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file private (0600); the target gets the mode any new file gets
        # (0666 less the umask), as every other record shardbench writes
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself, on disk
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _umask() -> int:
    """The process's umask: read from /proc where it can be (setting it to read it back would
    briefly change it for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``'s ``.lock`` file (created beside it) until exit."""
    lock = Path(path).with_name(Path(path).name + ".lock")
    with open(lock, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def split_partial_line(text: str) -> tuple[str, str]:
    """``text`` as (its complete lines, a last line without a newline: the remains of an
    interrupted write, to be set aside rather than glued to what is appended next)."""
    cut = text.rfind("\n") + 1
    return text[:cut], text[cut:]
