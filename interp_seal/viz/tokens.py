"""Token-level views: a prompt's real tokens, coloured by attention or by a signed effect.

Pure functions: token ids, attention rows or per-position values in; labels, windows, a
serialisable view and HTML out (CircuitsVis' ``ColoredTokens`` / ``AttentionPattern`` in spirit,
with no JavaScript: ``interp_seal.widgets.tokens`` adds hover and click-to-lock on top of
``AttentionView``).

- ``token_labels`` / ``pair_labels``: each token as the tokenizer decodes it alone, with
  whitespace made visible (``·`` space, ``↵`` newline, ``→`` tab);
- ``token_windows``: a long prompt cut down to windows around the spans that matter (the
  question, the answer's source line), the rest as counted ellipses;
- ``attention_view`` / ``attention_html``: one head's attention rows over the shown tokens,
  each skipped span's total weight kept as one number; the HTML colours the tokens by the row of
  one query (the answer position by default) on a fixed ``[0, vmax]`` scale;
- ``effect_html``: tokens coloured by a signed per-token value (direct logit attribution by
  source token, ``analysis.token_views.source_token_attribution``; a patching effect per
  position, ``position_effects``) on the project's signed scale (``colors.SIGNED``: blue helps,
  red hurts) centred on 0 with a fixed, titled range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

import numpy as np
import pandas as pd
from plotly.colors import sample_colorscale

from interp_seal.viz.colors import SIGNED, symmetric_range

Span = tuple[int, int]
WHITESPACE = {" ": "·", "\n": "↵", "\t": "→"}
ATTENTION_RGB = (94, 60, 153)  # purple: attention is neither a signed effect nor an edit


# -- labels ------------------------------------------------------------------------------------
def visible(text: str) -> str:
    """``text`` with spaces, newlines and tabs drawn as ``·``, ``↵`` and ``→``."""
    return "".join(WHITESPACE.get(c, c) for c in text)


def token_labels(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token of ``ids`` decoded on its own by ``tokenizer``, whitespace made visible."""
    return [visible(tokenizer.decode([int(i)])) for i in ids]


def pair_labels(tokenizer, clean_ids: Sequence[int], corrupted_ids: Sequence[int]) -> list[str]:
    """Labels of a patching pair: the clean token, or ``clean/corrupted`` where they differ."""
    if len(clean_ids) != len(corrupted_ids):
        raise ValueError(f"the prompts differ in length ({len(clean_ids)}, {len(corrupted_ids)})")
    clean, corrupted = token_labels(tokenizer, clean_ids), token_labels(tokenizer, corrupted_ids)
    return [a if a == b else f"{a}/{b}" for a, b in zip(clean, corrupted, strict=True)]


# -- windows -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """Positions ``start..end-1`` of a prompt, shown as tokens or skipped as one ellipsis."""

    start: int
    end: int
    shown: bool

    @property
    def size(self) -> int:
        return self.end - self.start


def token_windows(
    n_tokens: int,
    keep: Sequence[Span],
    *,
    margin: int = 4,
    max_tokens: int | None = None,
) -> list[Segment]:
    """Cut ``n_tokens`` positions into shown windows and skipped spans, in order.

    Each half-open span of ``keep`` is shown with ``margin`` tokens either side (clipped to the
    prompt); overlapping or touching windows merge; the rest is skipped. A prompt of at most
    ``max_tokens`` tokens is shown whole.
    """
    if max_tokens is not None and n_tokens <= max_tokens:
        return [Segment(0, n_tokens, True)]
    windows = []
    for start, end in sorted(keep):
        if not 0 <= start < end <= n_tokens:
            raise ValueError(f"span ({start}, {end}) is empty or outside 0..{n_tokens}")
        lo, hi = max(0, start - margin), min(n_tokens, end + margin)
        if windows and lo <= windows[-1][1]:
            windows[-1][1] = max(windows[-1][1], hi)
        else:
            windows.append([lo, hi])
    if not windows:
        return [Segment(0, n_tokens, True)]
    segments, cursor = [], 0
    for lo, hi in windows:
        if lo > cursor:
            segments.append(Segment(cursor, lo, False))
        segments.append(Segment(lo, hi, True))
        cursor = hi
    if cursor < n_tokens:
        segments.append(Segment(cursor, n_tokens, False))
    return segments


def shown_positions(segments: Sequence[Segment]) -> list[int]:
    """The positions of the shown segments, in order."""
    return [p for s in segments if s.shown for p in range(s.start, s.end)]


def skipped_count(segments: Sequence[Segment]) -> int:
    """How many tokens the skipped segments hide."""
    return sum(s.size for s in segments if not s.shown)


# -- attention ---------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AttentionView:
    """One head's attention over a (windowed) prompt, for the shown query positions.

    Attributes:
        labels: the label of every shown token, in order.
        positions: the prompt position of every shown token.
        segments: the prompt cut into shown and skipped segments (``token_windows``).
        weights: ``(shown query, shown key)`` attention weights (0 for future keys).
        skipped: ``(shown query, skipped segment)`` total weight on each skipped segment.
        title: what the view shows (model, head, record).
        vmax: the weight drawn at full colour (fixed for the view).
        focus: named spans to mark (e.g. ``{"source": ..., "question": ...}``).
    """

    labels: list[str]
    positions: list[int]
    segments: list[Segment]
    weights: np.ndarray
    skipped: np.ndarray
    title: str
    vmax: float = 1.0
    focus: dict[str, Span] = field(default_factory=dict)

    def row(self, position: int) -> dict[int, float]:
        """``{key position: weight}`` of query ``position`` over the shown keys."""
        i = self.positions.index(position)
        return dict(zip(self.positions, self.weights[i].tolist(), strict=True))

    def state(self) -> dict:
        """A JSON-serialisable copy (what the widget sends to the browser)."""
        return {
            "labels": self.labels,
            "positions": self.positions,
            "segments": [[s.start, s.end, s.shown] for s in self.segments],
            "weights": np.round(self.weights, 6).tolist(),
            "skipped": np.round(self.skipped, 6).tolist(),
            "title": self.title,
            "vmax": self.vmax,
            "focus": {name: list(span) for name, span in self.focus.items()},
        }


def attention_view(
    labels: Sequence[str],
    rows: np.ndarray,
    query_positions: Sequence[int],
    segments: Sequence[Segment],
    *,
    title: str,
    vmax: float = 1.0,
    focus: Mapping[str, Span] | None = None,
) -> AttentionView:
    """The view of ``rows`` (``(query, pos)``: the attention row of each of ``query_positions``
    over the whole prompt) restricted to the shown tokens of ``segments``.

    ``labels`` has one label per prompt position; ``query_positions`` must be exactly the shown
    positions (``shown_positions(segments)``), so that every shown token can be hovered.
    """
    rows = np.asarray(rows, dtype=np.float64)
    n = len(labels)
    if segments[0].start != 0 or segments[-1].end != n:
        raise ValueError(f"the segments cover {segments[0].start}..{segments[-1].end}, not 0..{n}")
    shown = shown_positions(segments)
    if list(query_positions) != shown:
        raise ValueError("query_positions must be the shown positions, in order")
    if rows.shape != (len(shown), n):
        raise ValueError(f"rows has shape {rows.shape}, expected {(len(shown), n)}")
    gaps = [s for s in segments if not s.shown]
    skipped = np.stack([rows[:, s.start : s.end].sum(1) for s in gaps], 1) if gaps else None
    return AttentionView(
        labels=[labels[p] for p in shown],
        positions=shown,
        segments=list(segments),
        weights=rows[:, shown],
        skipped=np.zeros((len(shown), 0)) if skipped is None else skipped,
        title=title,
        vmax=vmax,
        focus=dict(focus or {}),
    )


def attention_colour(weight: float, vmax: float) -> str:
    """The background of a token attended with ``weight`` (transparent 0 .. full at ``vmax``);
    the widget's script draws the same formula."""
    alpha = min(max(weight / vmax, 0.0), 1.0)
    return f"rgba({ATTENTION_RGB[0]}, {ATTENTION_RGB[1]}, {ATTENTION_RGB[2]}, {alpha:.3f})"


def attention_html(view: AttentionView, query: int | None = None) -> str:
    """Static HTML of ``view``: the tokens coloured by query ``query``'s row (default: the last
    shown position, the answer position of a prompt), the query outlined, each skipped span an
    ellipsis with its token count and total weight; a colour bar titled with the range."""
    query = view.positions[-1] if query is None else query
    row = view.row(query)
    i = view.positions.index(query)  # a ValueError for a position that is not shown
    gaps = iter(view.skipped[i].tolist())
    index = {p: k for k, p in enumerate(view.positions)}
    pieces = []
    for segment in view.segments:
        if not segment.shown:
            mass = next(gaps)
            _add_gap(pieces, _ellipsis(segment, f"; weight {mass:.3f} in total"))
            continue
        for p in range(segment.start, segment.end):
            label = view.labels[index[p]]
            weight = row[p]
            style = f"background:{attention_colour(weight, view.vmax)};"
            if weight / view.vmax > 0.6:
                style += "color:white;"
            if p == query:
                style += "outline:2px solid #212529;"
            tip = f"position {p} {label}: weight {weight:.4f}"
            pieces.append(_token(label, style, tip, _focus_of(view.focus, p)))
    bar = _colour_bar(
        f"attention weight of query {query} ({escape(view.labels[i])})",
        f"linear-gradient(to right, {attention_colour(0, 1)}, {attention_colour(1, 1)})",
        ["0", f"{view.vmax:g}"],
    )
    return _page(view.title, bar, pieces, view.segments)


# -- signed effects ----------------------------------------------------------------------------
def signed_colour(value: float, vmax: float) -> str:
    """The colour of ``value`` on the signed scale ``colors.SIGNED`` over ``[-vmax, vmax]``."""
    t = min(max(0.5 + 0.5 * value / vmax, 0.0), 1.0)
    return sample_colorscale(SIGNED, [t])[0]


def effect_html(
    labels: Sequence[str],
    values: Sequence[float],
    segments: Sequence[Segment],
    *,
    title: str,
    value_title: str,
    vmax: float | None = None,
    mark: int | None = None,
) -> str:
    """Tokens coloured by a signed per-position value (NaN: not computed, drawn dashed).

    ``vmax`` fixes the colour range to ``[-vmax, vmax]`` (default: the largest magnitude of the
    values), named ``value_title`` on the colour bar; ``mark`` outlines one position (the answer
    position the values are read at). Each token's tooltip gives its value.
    """
    values = np.asarray(values, dtype=np.float64)
    if len(values) != len(labels) or segments[-1].end != len(labels):
        raise ValueError(
            f"{len(labels)} labels, {len(values)} values and segments up to "
            f"{segments[-1].end} must agree"
        )
    vmax = symmetric_range(values) if vmax is None else vmax
    pieces = []
    for segment in segments:
        if not segment.shown:
            inside = values[segment.start : segment.end]
            finite = np.isfinite(inside)
            detail = f"; values sum to {inside[finite].sum():.4g}" if finite.any() else ""
            _add_gap(pieces, _ellipsis(segment, detail))
            continue
        for p in range(segment.start, segment.end):
            value = float(values[p])
            if np.isfinite(value):
                style = f"background:{signed_colour(value, vmax)};"
                if abs(value) / vmax > 0.6:
                    style += "color:white;"
                tip = f"position {p} {labels[p]}: {value:+.4g}"
            else:
                style, tip = "border:1px dashed #adb5bd;", f"position {p} {labels[p]}: not computed"
            if p == mark:
                style += "outline:2px solid #212529;"
            pieces.append(_token(labels[p], style, tip))
    stops = ", ".join(signed_colour(v, 1.0) for v in np.linspace(-1, 1, 9))
    bar = _colour_bar(
        escape(value_title),
        f"linear-gradient(to right, {stops})",
        [f"{-vmax:.3g}", "0", f"{vmax:+.3g}"],
    )
    return _page(title, bar, pieces, segments)


def position_effects(
    table: pd.DataFrame, n_tokens: int, *, site: str, layer: int, head: int | None = None
) -> np.ndarray:
    """``(n_tokens,)`` per-position effects from a patching table (``analysis.patching``): the
    ``value`` of the ``site`` patches at ``layer`` and each position (head patches summed over
    heads unless ``head`` is given); NaN where no position was patched."""
    rows = table[(table.site == site) & (table.layer == layer) & table.position.notna()]
    if head is not None:
        rows = rows[rows["head"] == head]
    if rows.empty:
        raise ValueError(f"the table has no per-position {site!r} patches at layer {layer}")
    by_position = rows.groupby("position")["value"].sum()
    values = np.full(n_tokens, np.nan)
    values[by_position.index.to_numpy(dtype=int)] = by_position.to_numpy()
    return values


# -- HTML pieces -------------------------------------------------------------------------------
def _focus_of(focus: Mapping[str, Span], position: int) -> str | None:
    return next((name for name, (a, b) in focus.items() if a <= position < b), None)


def _token(label: str, style: str, tip: str, focus: str | None = None) -> str:
    """One token; a label ending in a newline marker ends the line too."""
    underline = "border-bottom:2px solid #868e96;" if focus else ""
    tip += f" ({focus})" if focus else ""
    html = (
        f'<span title="{escape(tip)}" style="padding:1px 0;border-radius:2px;{underline}{style}">'
        f"{escape(label)}</span>"
    )
    return html + ("<br>" if label.endswith(WHITESPACE["\n"]) else "")


def _ellipsis(segment: Segment, detail: str) -> str:
    """A skipped segment: a line of its own saying what it hides."""
    return (
        '<div style="color:#868e96;font-style:italic;margin:2px 0">'
        f"[… {segment.size} tokens skipped, positions {segment.start}-{segment.end - 1}"
        f"{escape(detail)} …]</div>"
    )


def _add_gap(pieces: list[str], gap: str) -> None:
    """Append a skipped segment's line (no line break before it: it is a line of its own)."""
    if pieces and pieces[-1].endswith("<br>"):
        pieces[-1] = pieces[-1].removesuffix("<br>")
    pieces.append(gap)


def _colour_bar(title: str, gradient: str, ticks: Sequence[str]) -> str:
    ticks_html = "".join(f"<span>{escape(t)}</span>" for t in ticks)
    return (
        '<div style="display:flex;align-items:center;gap:8px;margin:4px 0 8px;font-size:12px">'
        f"<span>{title}</span>"
        '<div style="display:inline-flex;flex-direction:column;width:180px">'
        f'<div style="height:10px;border:1px solid #ced4da;background:{gradient}"></div>'
        f'<div style="display:flex;justify-content:space-between">{ticks_html}</div>'
        "</div></div>"
    )


def _page(title: str, bar: str, pieces: Sequence[str], segments: Sequence[Segment]) -> str:
    skipped = skipped_count(segments)
    shown = sum(s.size for s in segments if s.shown)
    note = f"{shown} tokens shown" + (f", {skipped} skipped" if skipped else "")
    return (
        '<div style="font-family:sans-serif;max-width:100%;margin-bottom:16px">'
        f"<div style='font-weight:bold'>{escape(title)}</div>"
        f"<div style='font-size:12px;color:#495057'>{note}</div>{bar}"
        '<div style="font-family:monospace;font-size:13px;line-height:1.9;white-space:pre-wrap;'
        f'word-break:break-all">{"".join(pieces)}</div></div>'
    )
