"""Where results go: output paths checked before any work, files written whole or not at all.

Two rules for everything interp-seal writes:

1. **Check the destination first.** A sweep or a tuning run can take hours; finding out at the
   end that ``--out`` is a file, or sits on a read-only disk, throws that work away.
   ``check_output_dir`` / ``check_output_file`` probe the destination (they create and delete a
   temporary file in the deepest directory that exists) and raise ``OutputPathError`` with what
   is wrong and how to fix it. They create nothing that stays.
2. **Never leave half a file.** ``atomic_path`` hands out a temporary name beside the target;
   the target appears (``os.replace``, atomic on POSIX) only once the writer has finished, so a
   kill or an exception leaves either the old file or none (after ``kill -9`` a hidden
   ``.<name>.tmp-<pid>`` file may stay beside it; the target name never holds half a file). ``write_text``, ``write_table`` and
   ``write_html`` are the common cases; ``atomic_dir`` does the same for a directory of files
   (a checkpoint), moving each finished file into place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class OutputPathError(ValueError):
    """An output path that cannot be written (a file where a directory is needed, no permission)."""


def _deepest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe(directory: Path, path: Path, flag: str) -> None:
    """Create and delete a temporary file in ``directory`` (what writing ``path`` needs)."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".interp-seal-probe-")
    except OSError as err:
        raise OutputPathError(
            f"{flag} {path}: cannot write in {directory} ({err.strerror or err}). Choose a "
            f"directory you can write to, or fix its permissions."
        ) from None
    os.close(fd)
    os.unlink(probe)


def check_output_dir(path: str | Path, *, flag: str = "--out") -> Path:
    """``path`` as a ``Path`` if a directory can be written there (existing or not); else raise.

    Nothing is created: the directory itself is made when the first result is written.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputPathError(
            f"{flag} {path} is a file, but a directory is needed for the results. Pass a "
            f"directory (it is created if missing), or move the file away."
        )
    base = _deepest_existing(path)
    if not base.is_dir():
        raise OutputPathError(
            f"{flag} {path} lies inside {base}, which is a file, not a directory. Pass a path "
            f"whose parents are directories."
        )
    _probe(base, path, flag)
    return path


def check_output_file(path: str | Path, *, flag: str = "--out") -> Path:
    """``path`` as a ``Path`` if a file can be written there; else raise (nothing created)."""
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(
            f"{flag} {path} is a directory, but a file name is needed (e.g. {path / 'out.jsonl'})."
        )
    check_output_dir(path.parent, flag=f"{flag} {path}: its directory")
    return path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write ``path`` through; moved onto ``path`` only on success.

    The temporary file sits in the same directory (so ``os.replace`` is atomic) and keeps the
    suffix (writers that pick a format by suffix still work). On an exception it is removed and
    ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A temporary directory to write the files of directory ``path`` into.

    On success each file moves into ``path`` with ``os.replace`` (files already there with
    other names stay); on an exception the temporary directory is removed and ``path`` is
    untouched. A kill can leave some new files beside old ones, never a half-written file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        yield tmp
        path.mkdir(exist_ok=True)
        for item in sorted(tmp.rglob("*")):
            target = path / item.relative_to(tmp)
            if item.is_dir():
                target.mkdir(exist_ok=True)
            else:
                os.replace(item, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (UTF-8); returns ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_table(table, path: str | Path) -> Path:
    """Write a DataFrame atomically as CSV or, for a ``.parquet`` path, parquet (no index)."""
    with atomic_path(path) as tmp:
        if tmp.suffix == ".parquet":
            table.to_parquet(tmp, index=False)
        else:
            table.to_csv(tmp, index=False)
    return Path(path)


def write_html(figure, path: str | Path) -> Path:
    """Write a plotly figure atomically as a self-contained HTML page."""
    with atomic_path(path) as tmp:
        figure.write_html(tmp)
    return Path(path)
