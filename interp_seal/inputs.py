"""What interp-seal reads: input files checked before they are opened, JSON parsed within limits.

The counterpart of ``outputs.py``. Every file a command reads whole goes through
``check_input_file`` first: a FIFO would block the read forever, ``/dev/zero`` never ends, and a
directory or a device is not the file the user meant, so each is refused by name (and a missing
file is a ``FileNotFoundError`` saying so). Every JSON document (a whole file such as
``config.json``, one line of a JSONL task file, a scale file's metadata, a dashboard state) goes
through ``parse_json`` (``read_json`` for a file), which refuses, naming the source and the fix:

- more than ``MAX_JSON_BYTES`` (measured before reading a file);
- text that is not JSON;
- nesting deeper than ``MAX_JSON_DEPTH`` (Python's parser would die of a ``RecursionError``);
- a string holding a lone UTF-16 surrogate (``"\\ud800"``: valid JSON, not valid Unicode; the
  tokenizer would fail on it far from the file).
"""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

MAX_JSON_BYTES = 16 << 20
"""The largest JSON document read: a config, a state, or one record of a JSONL file (a record
with a million-token context is ~5 MiB)."""
MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects read (our files nest 3 levels, configs 4)."""

RESTART = "damaged? Delete the run's directory (or choose another --out) and start over"
"""The fix for a damaged file a run of ours wrote (its state, records or manifest)."""

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}
_LIMIT = f"the {MAX_JSON_BYTES >> 20} MiB a JSON document may hold (is it the right file?)"
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_MAYBE_SURROGATE = re.compile(r"[\ud800-\udfff]|\\u[dD][89a-fA-F]")


def check_input_file(path: str | Path, what: str = "file") -> Path:
    """``path`` if it is a regular file (symbolic links followed); else raise.

    A missing path raises ``FileNotFoundError("no such {what}: {path}")``; a directory, FIFO,
    device or socket raises ``ValueError`` saying which it is.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"no such {what}: {path}") from None
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise ValueError(
            f"{path} is {kind}, not a regular file; a {what} is read whole, so pass a regular "
            "file (save the data to one first)"
        )
    return path


def read_json(path: str | Path, what: str = "JSON file", *, fix: str = "") -> object:
    """The JSON value of the regular file ``path``, checked as ``parse_json`` checks text."""
    path = check_input_file(path, what)
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise ValueError(_line(path, f"is {size:,} bytes, more than {_LIMIT}", fix))
    return parse_json(path.read_bytes(), str(path), fix=fix)


def parse_json(data: bytes | str, source: str, *, fix: str = "") -> object:
    """The JSON value of ``data`` (UTF-8 bytes or text); ``ValueError("{source}: ...; {fix}")``
    if it is too large, not UTF-8, not JSON, nested too deep or holds a lone surrogate."""
    if len(data) > MAX_JSON_BYTES:
        raise ValueError(_line(source, f"is longer than {_LIMIT}", fix))
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(_line(source, f"not UTF-8 text (byte {err.start + 1})", fix)) from None
    text = data
    deep = _line(source, f"nests arrays or objects more than {MAX_JSON_DEPTH} levels deep", fix)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            _line(source, f"not valid JSON ({err.msg}, {_where(text, err)})", fix)
        ) from None
    except RecursionError:  # deeper than Python's parser goes
        raise ValueError(deep) from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _deeper_than(value, MAX_JSON_DEPTH):
        raise ValueError(deep)
    if _MAYBE_SURROGATE.search(text):
        _check_unicode(value, source)
    return value


def _line(source, problem: str, fix: str) -> str:
    return f"{source}: {problem}" + (f"; {fix}" if fix else "")


def _where(text: str, err: json.JSONDecodeError) -> str:
    """``column C`` (one-line text) or ``line L, column C``; an error past the end of the text
    (it stops early) points just after its last character."""
    body = text.rstrip("\r\n")
    pos = min(err.pos, len(body))
    line, column = body.count("\n", 0, pos) + 1, pos - body.rfind("\n", 0, pos)
    return f"column {column}" if "\n" not in body else f"line {line}, column {column}"


def _deeper_than(value, limit: int) -> bool:
    """Whether ``value`` nests lists and dicts more than ``limit`` levels deep (iterative)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _check_unicode(value, source) -> None:
    """Raise naming the first string (key or value) of ``value`` with a lone surrogate."""
    stack = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, f"{where}.{key}" if where else str(key)))
                stack.append((child, f"{where}.{key}" if where else str(key)))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
        elif isinstance(item, str) and (found := _SURROGATE.search(item)):
            field = f"field {where!r}" if where else "the text"
            raise ValueError(
                _line(
                    source,
                    f"{field} holds a lone surrogate U+{ord(found.group()):04X} at character "
                    f"{found.start()}, which is not valid Unicode (half of a UTF-16 pair)",
                    "write the text as UTF-8, or escape both halves of the pair",
                )
            )
