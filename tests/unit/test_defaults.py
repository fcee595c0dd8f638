"""One definition of each default: no literal copy of a shared size or a method's learning rate.

The shared sizes live in ``interp_seal.defaults`` and the learning rates in
``interp_seal.tuning.methods``; a function parameter, dataclass field or CLI flag elsewhere that
writes the same number by hand would drift from them. The scan reads every module's syntax
tree: parameter defaults, annotated class fields, ``default=`` of ``add_argument``, and the
``lr`` of dict literals.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import interp_seal
from interp_seal.cli import main as _cli  # noqa: F401  (the CLI modules import cleanly)
from interp_seal.defaults import RECORDS_PER_LENGTH, TUNING_SAMPLES
from interp_seal.evaluation import evaluate_line_retrieval, line_retrieval_samples
from interp_seal.figures.sizes import FigureSizes
from interp_seal.tuning import accuracy_by_method, format_samples
from interp_seal.tuning.methods import METHODS

PACKAGE = Path(interp_seal.__file__).parent
SIZE_NAMES = {"n", "samples", "tune_n", "records", "n_samples"}
LEARNING_RATES = {m.lr for m in METHODS.values()}


def literal_defaults(tree: ast.AST):
    """``(name, value, line)`` of every literal number given as a default in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(
                zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
            )
            pairs += [
                (a, d)
                for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                if d is not None
            ]
            for arg, default in pairs:
                yield arg.arg, default
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            yield node.target.id, node.value
        elif isinstance(node, ast.keyword) and node.arg in ("default", "lr", "n", "tune_n"):
            yield node.arg, node.value
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "lr":
                    yield "lr", value


def copies(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.as_posix() in ("defaults.py", "tuning/methods.py"):
            continue
        for name, value in literal_defaults(ast.parse(path.read_text())):
            if not (isinstance(value, ast.Constant) and isinstance(value.value, int | float)):
                continue
            number = value.value
            size = name in SIZE_NAMES and number in (RECORDS_PER_LENGTH, TUNING_SAMPLES)
            rate = name == "lr" and number in LEARNING_RATES
            if size or rate:
                found.append(f"{rel}:{value.lineno}: {name} = {number}")
    return found


def test_no_default_is_written_twice():
    assert copies() == []


def test_the_scan_sees_a_copy(tmp_path):
    (tmp_path / "mod.py").write_text(
        "def f(n: int = 50, lr=1e-2):\n    return {'lr': 2e-4}\n"
        "class S:\n    tune_n: int = 50\n    other: int = 50\n"
    )
    found = sorted(c.split(": ", 1)[1] for c in copies(tmp_path))
    assert found == ["lr = 0.0002", "lr = 0.01", "n = 50", "tune_n = 50"]


def test_entry_points_refer_to_the_one_default():
    for fn in (evaluate_line_retrieval, line_retrieval_samples, accuracy_by_method):
        assert inspect.signature(fn).parameters["n"].default == RECORDS_PER_LENGTH
    assert inspect.signature(format_samples).parameters["n"].default == TUNING_SAMPLES
    assert FigureSizes().n == RECORDS_PER_LENGTH and FigureSizes().tune_n == TUNING_SAMPLES
    assert not hasattr(FigureSizes(), "mudaf_lr")  # the gallery trains at METHODS' rate
    assert FigureSizes().as_dict()["mudaf_lr"] == METHODS["mudaf"].lr  # and records it
