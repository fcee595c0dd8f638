"""How big each figure's experiment is, per model: ``preset_sizes(model, quick=...)``.

- the organism: ``DEFAULT`` (the committed organism gallery) and ``QUICK`` (``--quick``);
  SEAL's lengths are numbers of LongEval lines (its ``max_position_embeddings`` is 4,096);
- any other model without a preset: the organism's sizes with the long needle haystack
  (``OTHER``, ``OTHER_QUICK``; see ``haystack``);
- SmolLM2-135M-Instruct (``"smollm2"``): ``presets/smollm2.json``, with its task format
  (integer line indices, its chat template, answer lead-ins) and sizes picked from the
  measurements in ``figures/README.md``.

MuDAF's sizes are numbers of passages of the synthetic multi-document QA
(``interp_seal.tasks.passages``, 1-hop). Every number of records per point is written on the
gallery page next to the result it produced.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from interp_seal.defaults import RECORDS_PER_LENGTH, TUNING_SAMPLES
from interp_seal.tasks.chat import check_template
from interp_seal.tasks.line_retrieval import INDEX_STYLES
from interp_seal.tasks.needle import ANSWERS, HAYSTACKS
from interp_seal.tasks.passages import PassagesConfig
from interp_seal.tuning.methods import METHODS


@dataclass(frozen=True, kw_only=True)
class FigureSizes:
    """Experiment sizes shared by the figures.

    Attributes:
        n: records per evaluated point (accuracy at one length, one method).
        lengths: line counts of the accuracy-vs-length curves (SEAL Table 1, Fig. 2d).
        mid, long: the two lengths of the head quadrants (SEAL Fig. 2b); ``long`` is also the
            length of single-point comparisons.
        sweep_n: records per length in the head and channel sweeps.
        confirm_n: fresh records (``figures.seal.FRESH_SEED``) on which the claims are
            tested again: Fig. 2b's best and worst head at ``long``, Fig. 2d's scale tables
            and Table 1's compared methods at every length, the records Fig. 4 draws its 30
            wrong ones from. Picked by a power calculation on pilot runs (below).
        replicate_n: fresh records (``figures.seal.REPLICATE_SEED``) at ``long`` on which
            Fig. 2d's claimed scaling (Q1 x 0.9 + Q3 x 1.1) is tested once more: the
            confirmation halved the pilot's effect, and its power calculation asked for more
            records than ``confirm_n`` (below).
        channel_heads: heads opened in the channel sweep (SEAL Fig. 2c), alternately the one
            whose pruning hurts most and the one whose pruning helps most at ``long``.
        tune_n, tune_lines: tuning samples (SEAL: 50; MuDAF and SFT use ``tune_n`` too, with
            ``retrieval_passages`` passages) and SEAL's line count.
        lrs, sample_counts: SEAL Table 4's grid (SEAL-H, accuracy at ``long``).
        extension_lengths: line counts beyond the trained reach (SEAL Table 2).
        ntk_factor: NTK-aware scaling factor; se_group, se_window: Self-Extend's G and W.
        needle_lengths, needle_depths: SEAL Fig. 5's grid (tokens, percent).
        needle_answer: what a needle's answer is (``tasks.needle.ANSWERS``): its key phrase,
            as the organism v2 was trained to answer, or SEAL's whole sentence.
        retrieval_n, retrieval_passages: MuDAF's evaluation questions and their passages (one
            golden): retrieval scores (Sec. 3.1), task exact match, masking (Fig. 4).
        confirm_questions: fresh questions (``figures.mudaf.FRESH_SEED``) on which MuDAF's
            claims are tested again: the target heads' retrieval scores under MuDAF vs Vanilla
            SFT (Fig. 5) and masking the retrieval heads vs random heads (Fig. 4), the heads
            chosen on the ``retrieval_n`` questions (the pilot). Picked from the pilot's power
            calculation (below).
        more_questions: fresh questions added after the first confirmation, in whole chunks of
            ``QUESTION_CHUNK``, when a power calculation on it asks for more (the claims read
            ``fresh_questions``, the sum). Not part of the run's identity (``as_dict``): the
            passage generator is prefix-stable and each chunk is stored under its index, so
            adding chunks leaves every stored result valid; a figure already on disk is
            recomputed by deleting its ``data/<name>.json``.
        mudaf_k: target heads drawn for MuDAF (its learning rate, and SFT's, is the method's
            one default, ``interp_seal.tuning.methods``).
        head_counts: MuDAF Table 4 / Fig. 7's numbers of selected heads.
        mask_k, mask_seeds: MuDAF Fig. 4's masked-head count and random draws. ``mask_k`` is
            the top 5 % of the model's heads, the scale at which retrieval heads are counted
            in the papers (Wu et al. 2024; MuDAF Fig. 4 masks the top heads of 1,024): 2 of
            the organism's 32, 14 of SmolLM2's 270 (its preset).
        heatmap_passages: passages of the MuDAF Fig. 10 question.
        preset: the name of these sizes (``PRESETS``), written to ``run.json``.
        index_style: LongEval's line indices (``line_retrieval.INDEX_STYLES``) of every line
            record of the run: evaluations, sweeps, DLA and tuning samples.
        chat_template: the conversation format every prompt of the run is wrapped in
            (``interp_seal.tasks.chat``: ``"none"``, ``"tokenizer"`` for the model's own): line
            records, needles and passage questions alike, for evaluation and tuning.
        lead_in: force the start of each needle and passage answer after the prompt, as the
            LongEval records force ``The <REGISTER_CONTENT> in line X is``: a needle's sentence
            up to its key phrase (``needle.lead_in``), a passage question restated
            (``passages.lead_in``). A chat model opens its reply with a capitalised sentence of
            its own wording; with the lead-in forced, exact match scores the retrieved fact.
        needle_n: needles per cell of the needle grid (SEAL Fig. 5; each its own seeded needle).
        haystack, haystack_repeat: the needles' built-in haystack (``tasks.needle.HAYSTACKS``),
            and whether it may be repeated to fill a context: a needle in a repeated text is
            the one sentence not seen before, found by novelty, without retrieval. The field
            defaults are the short ``"essays"``, repeated, the text every gallery was first
            made on (so they stay out of the identity of galleries made before the fields
            existed); SmolLM2's preset keeps them until its needle figures are regenerated.
            The organism gallery uses ``"organism"``, written in its word-level vocabulary,
            never repeated (``DEFAULT``, ``QUICK``); every other model ``"long"``, never
            repeated (``OTHER``).
        extension_task: the task of SEAL Table 2: ``"line_retrieval"`` (``extension_lengths``
            are line counts; SEAL-C tuned on line records) or ``"needle"`` (SEAL Fig. 6:
            ``extension_lengths`` are context lengths in tokens, the grid's depths, ``needle_n``
            needles per cell; SEAL-C tuned on needle-format samples).
        tuning_seeds: tuning runs of each SEAL method Table 1's claims compare (SEAL-H, SEAL-C,
            LoRA), each on its own samples in its own order (``FigureRun.tuning_samples``):
            the paper reports one run each; a claim here holds only if it holds for every run.
        extension_tune_n: needle-format tuning samples (default ``tune_n``) of the extensions'
            SEAL-C (Table 2) and of every method of the needle grid (Fig. 5).

    Sizes of the figures plan amendment 1 added (issue 41, ``figures.definitions``); like
    ``more_questions`` they are not part of the run's identity (``as_dict``), so the galleries
    made before them stay valid: the amendment (``plan_amendment_1.json``) pre-registers them.

        definition_questions: fresh passage questions (``figures.mudaf.FRESH_SEED``, a prefix
            of MuDAF's fresh questions; never the detection questions) on which the top 5 % of
            heads by each definition are zeroed.
        causal_n: detection questions (the first of ``retrieval_n``) in the causal definition's
            head sweep; None: all of them. Exact sweeps cost one forward per head and question.
        duo_lines: line count of the DuoAttention gates' tuning records (``tune_n`` records of
            the tuning seed 0, ``FigureRun.tuning_samples``): long enough that the streaming
            window drops most of the record, so the gates learn which heads need it.
        kv_lengths: line counts of the accuracy-vs-KV-budget figure (fresh records, seed
            ``figures.definitions.KV_SEED``); the compression claims read the longest.
        kv_n: records per length there.
        kv_sink, kv_window: a streaming head's attention sinks and recent window (tokens); the
            gates are trained with the same two.
        kv_full_counts: numbers of full KV heads on the curve; the claims' budget, a quarter of
            the KV heads rounded up (``figures.definitions.BUDGET_SHARE``), is added.
    """

    n: int = RECORDS_PER_LENGTH
    lengths: tuple[int, ...] = (40, 80, 120, 160, 200)
    mid: int = 120
    long: int = 160
    sweep_n: int = 30
    confirm_n: int = 160
    replicate_n: int = 600
    channel_heads: int = 2
    tune_n: int = TUNING_SAMPLES
    tune_lines: int = 160
    lrs: tuple[float, ...] = (5e-3, 1e-2, 3e-2)
    sample_counts: tuple[int, ...] = (10, 30, 50)
    extension_lengths: tuple[int, ...] = (200, 250, 300)
    ntk_factor: float = 4.0
    se_group: int = 4
    se_window: int = 256
    needle_lengths: tuple[int, ...] = (500, 1000, 2000)
    needle_depths: tuple[float, ...] = (0, 25, 50, 75, 100)
    needle_answer: str = "key_phrase"
    retrieval_n: int = 50
    retrieval_passages: int = 10
    confirm_questions: int = 440
    mudaf_k: int = 4
    head_counts: tuple[int, ...] = (1, 2, 4, 8)
    mask_k: int = 2
    mask_seeds: tuple[int, ...] = (0, 1, 2)
    heatmap_passages: int = 5
    preset: str = "organism"
    index_style: str = "adjective-noun"
    chat_template: str = "none"
    lead_in: bool = False
    needle_n: int = 1
    haystack: str = "essays"
    haystack_repeat: bool = True
    extension_task: str = "line_retrieval"
    extension_tune_n: int | None = None
    tuning_seeds: int = 3
    more_questions: int = 0
    # plan amendment 1 (issue 41). Organism: records of 40-200 lines are 0.6K-2.7K tokens
    # (measured), inside its 4,096-token window; a 64-token window (4 sinks) keeps the question
    # and the answer's lead-in but drops 90-98 % of the record, so a streaming head must do
    # without the queried line; 8 KV heads: 1, 2 (the claims' quarter), 4 and 6 kept full; the
    # gates train on records of the longest length. SmolLM2 (presets/smollm2.json): it
    # retrieves lines only in its 3-7-line regime, so 5 and 7 lines (~264 and ~301 tokens in
    # its chat template, far inside its 8K window; 7, the gallery's long length, is where its
    # base model retrieves a non-last line best, 0.22 in SEAL Table 1's fresh records against
    # 0.15 at 5 and 10, so the compression claims read there; chosen before any KV data) with
    # the same 64-token window, which drops ~75-80 % of the record and keeps the question; 90 KV heads: 9, 23 (the quarter) and 45
    # full; its causal sweep runs on 10 of the 40 detection questions (270 heads, one forward
    # per head and question on one CPU thread); gates on 10-line tuning records.
    definition_questions: int = 440
    causal_n: int | None = None
    duo_lines: int = 200
    kv_lengths: tuple[int, ...] = (40, 120, 200)
    kv_n: int = 100
    kv_sink: int = 4
    kv_window: int = 64
    kv_full_counts: tuple[int, ...] = (1, 2, 4, 6)

    def __post_init__(self):
        counts = (self.n, self.sweep_n, self.confirm_n, self.replicate_n, self.tune_n)
        counts += (self.confirm_questions, self.tuning_seeds)
        if self.mid >= self.long or min(counts) < 1:
            raise ValueError(
                f"sizes need mid < long and at least one record per point (mid={self.mid}, "
                f"long={self.long}, n={self.n}, sweep_n={self.sweep_n}, "
                f"confirm_n={self.confirm_n}, replicate_n={self.replicate_n}, "
                f"tune_n={self.tune_n}, confirm_questions={self.confirm_questions})"
            )
        for p in (self.retrieval_passages, self.heatmap_passages):
            PassagesConfig(num_passages=p)  # refuses a count outside 2..MAX_PASSAGES
        if max(self.sample_counts) > self.tune_n:
            raise ValueError(
                f"sample_counts {self.sample_counts} exceed tune_n={self.tune_n}; Table 4's "
                "subsets are drawn from the tuning samples"
            )

        if self.index_style not in INDEX_STYLES:
            raise ValueError(f"index_style must be one of {INDEX_STYLES}, got {self.index_style!r}")
        check_template(self.chat_template)
        if self.needle_answer not in ANSWERS:
            raise ValueError(f"needle_answer must be one of {ANSWERS}, got {self.needle_answer!r}")
        if self.needle_n < 1:
            raise ValueError(f"needle_n must be >= 1, got {self.needle_n}")
        if self.haystack not in HAYSTACKS:
            raise ValueError(
                f"haystack must be a built-in haystack {sorted(HAYSTACKS)}, got {self.haystack!r} "
                "(records are fingerprinted by the sizes, so a file's text could change unseen)"
            )
        if self.more_questions and (
            self.more_questions < 0
            or (self.more_questions % QUESTION_CHUNK)
            or (self.confirm_questions % QUESTION_CHUNK)
        ):
            raise ValueError(
                f"more_questions={self.more_questions} adds whole chunks of {QUESTION_CHUNK} "
                f"fresh questions to confirm_questions={self.confirm_questions}: both must be "
                f"multiples of {QUESTION_CHUNK} (a partial chunk would change under its index)"
            )
        if min(self.kv_n, self.kv_sink, self.kv_window, self.definition_questions) < 1 or not (
            self.kv_lengths
        ):
            raise ValueError(
                "the KV budget figure needs lengths, records, a sink and a window (kv_lengths="
                f"{self.kv_lengths}, kv_n={self.kv_n}, kv_sink={self.kv_sink}, "
                f"kv_window={self.kv_window}); definition_questions={self.definition_questions}"
            )
        if self.extension_task not in EXTENSION_TASKS:
            raise ValueError(
                f"extension_task must be one of {EXTENSION_TASKS}, got {self.extension_task!r}"
            )

    def as_dict(self) -> dict:
        """The sizes as ``run.json`` and the records' fingerprints hold them.

        The fields added after the organism gallery was first made (``LATER_FIELDS``) are
        written only where they differ from their defaults, the organism's, so that the
        organism gallery's ``run.json`` and stored records, made before those fields existed,
        stay valid. ``mudaf_lr`` records the learning rate MuDAF and SFT train at, the method's
        one default (``interp_seal.tuning.methods``), not a size of the gallery's own.
        """
        d = {k: v for k, v in asdict(self).items() if k not in NOT_IDENTITY}
        defaults = {f.name: f.default for f in fields(self)}
        d = {k: v for k, v in d.items() if k not in LATER_FIELDS or v != defaults[k]}
        return d | {"mudaf_lr": METHODS["mudaf"].lr}

    def amendment_sizes(self) -> dict:
        """The sizes plan amendment 1 pre-registers (``AMENDMENT_FIELDS``)."""
        return {k: getattr(self, k) for k in AMENDMENT_FIELDS}

    @property
    def fresh_questions(self) -> int:
        """MuDAF's fresh questions: ``confirm_questions + more_questions``."""
        return self.confirm_questions + self.more_questions


EXTENSION_TASKS = ("line_retrieval", "needle")
AMENDMENT_FIELDS = (  # plan amendment 1's sizes: in its file, not in run.json
    "definition_questions",
    "causal_n",
    "duo_lines",
    "kv_lengths",
    "kv_n",
    "kv_sink",
    "kv_window",
    "kv_full_counts",
)
NOT_IDENTITY = ("more_questions", *AMENDMENT_FIELDS)
QUESTION_CHUNK = 40  # fresh questions per stored result: a killed run loses at most one chunk
LATER_FIELDS = (
    "preset",
    "index_style",
    "chat_template",
    "lead_in",
    "needle_n",
    "extension_task",
    "extension_tune_n",
    "confirm_n",
    "replicate_n",
    "confirm_questions",
    "tuning_seeds",
    "haystack",
    "haystack_repeat",
)


DEFAULT = FigureSizes(haystack="organism", haystack_repeat=False)
QUICK = replace(  # the organism's gallery, small
    DEFAULT,
    n=4,
    lengths=(6, 12),
    mid=6,
    long=12,
    sweep_n=3,
    confirm_n=3,
    replicate_n=3,
    channel_heads=2,
    tune_n=4,
    tune_lines=12,
    lrs=(1e-2,),
    sample_counts=(2, 4),
    extension_lengths=(16,),
    se_window=32,
    needle_lengths=(300,),
    needle_depths=(0, 100),
    retrieval_n=3,
    retrieval_passages=4,
    confirm_questions=3,
    mudaf_k=2,
    head_counts=(1, 2),
    mask_k=2,
    mask_seeds=(0,),
    heatmap_passages=3,
    tuning_seeds=1,
    definition_questions=3,
    duo_lines=24,
    kv_lengths=(24,),
    kv_n=3,
    kv_window=16,  # 24 lines are ~430 tokens: the window drops 96 % of them
    kv_full_counts=(1, 2, 4),
)
OTHER = dataclasses.replace(DEFAULT, haystack="long", haystack_repeat=False)
OTHER_QUICK = dataclasses.replace(QUICK, haystack="long", haystack_repeat=False)


PRESETS = Path(__file__).parent / "presets"  # <model>.json: {"full": {...}, "quick": {...}}


@functools.cache
def preset(model: str) -> tuple[FigureSizes, FigureSizes] | None:
    """``model``'s (full, quick) sizes from ``presets/<model>.json`` (each the fields that
    differ from ``DEFAULT`` / ``QUICK``), or None without a preset. How SmolLM2's were picked,
    measurement by measurement: ``figures/README.md``."""
    path = PRESETS / f"{model}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    full = dataclasses.replace(DEFAULT, **from_json(data["full"]))
    return full, dataclasses.replace(QUICK, **from_json(data["quick"]))


def from_json(values: dict) -> dict:
    """Sizes as JSON holds them (a preset, ``plan.json``, an amendment) as ``FigureSizes``
    fields: lists become tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


def preset_sizes(model: str, *, quick: bool = False) -> FigureSizes:
    """The sizes for ``model``: its preset (by the name ``load_model`` takes, ``presets/``),
    else the organism's (``DEFAULT``, ``QUICK``) for the organism and ``OTHER`` /
    ``OTHER_QUICK`` for any other model."""
    full, small = preset(str(model)) or (
        (DEFAULT, QUICK) if str(model) == "organism" else (OTHER, OTHER_QUICK)
    )
    return small if quick else full
