"""Where results go: output paths checked before any work, files written whole or not at all.

Two rules for everything interp-seal writes:

1. **Check the destination first.** A sweep or a tuning run can take hours; finding out at the
   end that ``--out`` is a file, or sits on a read-only disk, throws that work away.
   ``check_output_dir`` / ``check_output_file`` probe the destination (they create and delete a
   temporary file in the deepest directory that exists) and raise ``OutputPathError`` with what
   is wrong and how to fix it. They create nothing that stays.
2. **One run per directory, and never someone else's directory.** ``claim_output_dir`` takes
   ``--out`` for the duration of a command: an exclusive lock (a second run on the same
   directory stops at once, naming the PID that holds it; the lock dies with its process, even
   after ``kill -9``), and a refusal to write into a non-empty directory that holds none of our
   runs (unless ``force``), following symlinks to what they point at. A directory becomes one
   of our runs through its ``.interp-seal-run`` mark (or a run manifest of ours).
3. **Never leave half a file.** ``atomic_path`` hands out a temporary name beside the target;
   the target appears (``os.replace``, atomic on POSIX) only once the writer has finished, so a
   kill or an exception leaves either the old file or none (after ``kill -9`` a hidden
   ``.<name>.tmp-<pid>`` file may stay beside it; the target name never holds half a file). ``write_text``, ``write_table`` and
   ``write_html`` are the common cases (HTML pages share one ``plotly.min.js`` per
   directory); ``atomic_dir`` does the same for a directory of files (a checkpoint), moving
   each finished file into place.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from interp_seal.inputs import parse_json

RUN_MARK = ".interp-seal-run"
"""The file that marks a directory as one of our runs; locked while a run writes there."""
RUN_MANIFESTS = (RUN_MARK, "manifest.json", "run.json")
"""What an interp-seal run leaves: its mark, and the manifest of a record store or a gallery
(``is_our_run`` checks their content, not only their names)."""


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


def check_output_file(path: str | Path, *, flag: str = "--out", force: bool = True) -> Path:
    """``path`` as a ``Path`` if a file can be written there; else raise (nothing created).

    Only regular files are ever replaced: a link, a device node, a FIFO or a socket at
    ``path`` is refused, and an existing file unless ``force``.
    """
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise OutputPathError(
            f"{flag} {path} is a directory, but a file name is needed (e.g. {path / 'out.jsonl'})."
        )
    if os.path.lexists(path):
        mode = path.lstat().st_mode
        if not stat.S_ISREG(mode):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
            raise OutputPathError(
                f"{flag} {path} is {kind}; interp-seal replaces only regular files. Give the "
                "name of a new file."
            )
        if not force:
            raise OutputPathError(
                f"{flag} {path} exists; choose a new file name, or pass --force to replace it"
            )
    check_output_dir(path.parent, flag=f"{flag} {path}: its directory")
    return path


def resolve_output_dir(path: str | Path, *, flag: str = "--out") -> Path:
    """``path`` with symlinks followed; a dangling link or a loop is an ``OutputPathError``."""
    path = Path(path)
    try:
        resolved = path.resolve(strict=False)
    except (RuntimeError, OSError) as err:  # Python 3.11 raises RuntimeError on a loop
        raise OutputPathError(
            f"{flag} {path}: cannot follow its symbolic links ({err}); remove the loop or "
            "choose another directory"
        ) from None
    if path.is_symlink() and not resolved.exists():
        raise OutputPathError(
            f"{flag} {path} is a symbolic link to {os.readlink(path)}, which does not exist; "
            "create the directory it points to, or remove the link"
        )
    return resolved


def is_our_run(directory: Path) -> bool:
    """Whether ``directory`` holds an interp-seal run, or holds only such runs (``results/``
    after ``--out results/smollm2``).

    A run is known by its mark (a regular file, not a link, naming the command that made it),
    or, for runs made before marks existed (the committed galleries), by a manifest whose
    content is one of ours; a file's name alone proves nothing.
    """
    if _read_mark(directory / RUN_MARK).get("command") is not None:
        return True
    if any(_our_manifest(directory / name) for name in RUN_MANIFESTS[1:]):
        return True
    entries = list(directory.iterdir())
    return bool(entries) and all(
        entry.is_dir() and not entry.is_symlink() and is_our_run(entry) for entry in entries
    )


@contextmanager
def claim_output_dir(
    path: str | Path,
    *,
    force: bool = False,
    flag: str = "--out",
    command: str = "",
    resume: bool | None = None,
) -> Iterator[Path]:
    """Hold ``path`` as this run's output directory for the ``with`` block; yields it resolved.

    Refuses (``OutputPathError``, before any work) a directory another run holds, and a
    non-empty directory with none of our runs in it unless ``force``. The one resume policy
    of long runs (``resume`` True or False; None for commands that simply write their
    results): a directory an earlier run left results in is continued only with ``resume``,
    never silently. On leaving the block the lock is released; a run that failed before
    writing anything leaves no trace (its mark and the directories it created are removed; a
    directory taken with ``force`` does not become one of our runs).
    """
    target = resolve_output_dir(path, flag=flag)
    if target.is_dir() and not force and not is_our_run(target):
        found = sorted(p.name for p in target.iterdir())
        if found:
            shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
            raise OutputPathError(
                f"{flag} {path} holds files interp-seal did not write ({shown}); choose a new "
                "or empty directory, or pass --force to write into it (files with the names "
                "of results are overwritten)"
            )
    created = []
    for parent in reversed([target, *target.parents]):
        if not parent.exists():
            created.append(parent)
    target.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in target.iterdir()}
    mark = target / RUN_MARK
    marked = not os.path.lexists(mark)
    try:  # never through a link: a planted one would make this run truncate another file
        fd = os.open(mark, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as err:
        raise OutputPathError(
            f"{flag} {path}: its run mark {RUN_MARK} is not a regular file ({err.strerror}); "
            "remove it, or choose another directory"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise OutputPathError(
            f"{flag} {path}: its run mark {RUN_MARK} is not a file of this directory alone "
            "(a link to another file); remove it, or choose another directory"
        )
    succeeded = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            holder = _read_mark(mark)
            raise OutputPathError(
                f"{flag} {path} is in use by PID {holder.get('pid', '?')} "
                f"({holder.get('command') or 'another interp-seal run'}); wait for it to "
                "finish, or choose another directory"
            ) from None
        earlier_results = before - {RUN_MARK}
        if resume is False and not marked and earlier_results:
            earlier = _read_mark(mark).get("command") or "an earlier interp-seal run"
            raise OutputPathError(
                f"{flag} {path} holds the results of an earlier run ({earlier}); pass --resume "
                "to continue it (finished parts are kept, the rest is computed), or choose "
                "another directory"
            )
        if resume is None and not force and not marked and earlier_results:
            earlier = _read_mark(mark).get("command") or "an earlier interp-seal run"
            raise OutputPathError(
                f"{flag} {path} holds the results of an earlier run ({earlier}); choose another "
                "directory, or pass --force to replace them"
            )
        os.ftruncate(fd, 0)
        info = {"pid": os.getpid(), "command": command, "started": time.time()}
        os.write(fd, (json.dumps(info) + "\n").encode())
        yield target
        succeeded = True
    finally:
        os.close(fd)  # releases the lock
        if not succeeded and marked:
            if not {p.name for p in target.iterdir()} - before - {RUN_MARK}:
                mark.unlink(missing_ok=True)
                for directory in reversed(created):
                    try:
                        directory.rmdir()
                    except OSError:
                        break


def _read_mark(mark: Path) -> dict:
    """The mark's content; {} for anything but a regular, singly linked file of ours."""
    try:
        fd = os.open(mark, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_size > 1 << 16:
            return {}
        data = parse_json(os.read(fd, info.st_size) or b"null", str(mark))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)


def _our_manifest(path: Path) -> bool:
    """Whether ``path`` is a manifest we write: a regular file holding a JSON object with a
    ``model`` and the identity our runs record beside it (``sizes``, ``geometry``)."""
    if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 22:
        return False
    try:
        data = parse_json(path.read_bytes(), str(path))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "model" in data and bool({"sizes", "geometry"} & set(data))


def command_line() -> str:
    """The command this process runs, as typed (for run marks)."""
    return " ".join(["interp-seal", *sys.argv[1:]])


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Give a file-system error without a file name (a write that found the disk full) the
    name of the ``path`` being written, so the message can say where."""
    try:
        yield
    except OSError as err:
        if err.filename is None and err.errno is not None:
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


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
        with _naming(path):
            yield tmp
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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


PLOTLY_JS = "plotly.min.js"
"""The one copy of plotly.js in an output directory, loaded by every HTML page written there."""


def write_plotly_js(directory: str | Path) -> Path:
    """``directory/plotly.min.js``: the plotly.js that plotly.py bundles (~4.8 MB), written
    unless the file already holds exactly it (a newer plotly replaces an older copy)."""
    from plotly.offline import get_plotlyjs

    path = Path(directory) / PLOTLY_JS
    js = get_plotlyjs()
    if path.is_symlink() or not path.is_file() or path.read_text(encoding="utf-8") != js:
        write_text(path, js)
    return path


def write_html(figures, path: str | Path, **options) -> Path:
    """Write a plotly figure, or a list of them one below the other, atomically as an HTML page.

    The page loads plotly.js from ``plotly.min.js`` beside it, written there once
    (``write_plotly_js``): every page of a directory shares one copy, a page is a few kB
    instead of 4.8 MB, and it opens offline (copy the directory, or both files, to share
    it). ``options`` are ``figure.write_html``'s keyword arguments; ``include_plotlyjs=True``
    embeds plotly.js in the page instead.
    """
    options = {"include_plotlyjs": PLOTLY_JS, **options}
    if options["include_plotlyjs"] == PLOTLY_JS:
        write_plotly_js(Path(path).parent)
    figures = figures if isinstance(figures, list | tuple) else [figures]
    with atomic_path(path) as tmp:
        if len(figures) == 1:
            figures[0].write_html(tmp, **options)
        else:  # plotly.js loaded by the first figure's div, once
            first, *rest = figures
            parts = [first.to_html(full_html=False, **options)]
            later = {**options, "include_plotlyjs": False}
            parts += [fig.to_html(full_html=False, **later) for fig in rest]
            page = "<html><body>\n" + "\n".join(parts) + "\n</body></html>\n"
            tmp.write_text(page, encoding="utf-8")
    return Path(path)


@contextmanager
def atomic_dir(path: str | Path, *, mode: str = "files") -> Iterator[Path]:
    """Write directory ``path`` through a temporary directory beside it that the block fills;
    an error or a kill inside the block leaves ``path`` as it was. The one way the library
    writes a directory; ``mode`` says what happens when the block has finished:

    - ``"files"``: each file moves into ``path`` with ``os.replace`` (files already there
      with other names stay): results written into a user's directory. A kill can leave some
      new files beside old ones, never a half-written file.
    - ``"replace"``: the directory takes ``path``'s place whole; an existing ``path`` is moved
      aside first and removed last (``recover_dir`` restores it after a kill between the two
      renames): checkpoints, where old and new files must never mix.
    - ``"create"``: the first complete version wins; if another process finished ``path``
      meanwhile, this copy is dropped: caches that several processes may fill at once.
    """
    if mode not in ("files", "replace", "create"):
        raise ValueError(f"mode must be 'files', 'replace' or 'create', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        with _naming(path):
            yield tmp
        if mode == "files":
            path.mkdir(exist_ok=True)
            for item in sorted(tmp.rglob("*")):
                target = path / item.relative_to(tmp)
                if item.is_dir():
                    target.mkdir(exist_ok=True)
                else:
                    os.replace(item, target)
        elif mode == "create":
            try:
                os.rename(tmp, path)
            except OSError:  # finished by another process meanwhile (a non-empty path)
                if not path.is_dir():
                    raise
        else:
            old = path.with_name(f".{path.name}.old")
            if path.exists():
                shutil.rmtree(old, ignore_errors=True)
                os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def recover_dir(path: str | Path) -> Path | None:
    """``path`` if it holds a complete directory written by ``atomic_dir`` (restoring the
    previous version if a kill struck between its renames), else None."""
    path = Path(path)
    old = path.with_name(f".{path.name}.old")
    if not path.exists() and old.exists():
        os.rename(old, path)
    return path if path.exists() else None
