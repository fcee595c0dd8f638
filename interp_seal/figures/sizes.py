"""How big each figure's experiment is, per model: ``preset_sizes(model, quick=...)``.

- the organism (the default for any model without a preset): ``DEFAULT`` (the committed
  organism gallery) and ``QUICK`` (``--quick``); SEAL's lengths are numbers of LongEval lines
  (its ``max_position_embeddings`` is 4,096);
- SmolLM2-135M-Instruct (``"smollm2"``): ``SMOLLM2`` and ``SMOLLM2_QUICK``, with its task
  format (integer line indices, its chat template, answer lead-ins) and sizes picked from
  measurements written beside them below.

MuDAF's sizes are numbers of passages of the synthetic multi-document QA
(``interp_seal.tasks.passages``, 1-hop). Every number of records per point is written on the
gallery page next to the result it produced.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, fields

from interp_seal.tasks.chat import check_template
from interp_seal.tasks.line_retrieval import INDEX_STYLES
from interp_seal.tasks.needle import ANSWERS
from interp_seal.tasks.passages import PassagesConfig


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
        mudaf_k: target heads drawn for MuDAF; mudaf_lr: its learning rate (and SFT's).
        head_counts: MuDAF Table 4 / Fig. 7's numbers of selected heads.
        mask_k, mask_seeds: MuDAF Fig. 4's masked-head count and random draws.
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
        extension_task: the task of SEAL Table 2: ``"line_retrieval"`` (``extension_lengths``
            are line counts; SEAL-C tuned on line records) or ``"needle"`` (SEAL Fig. 6:
            ``extension_lengths`` are context lengths in tokens, the grid's depths, ``needle_n``
            needles per cell; SEAL-C tuned on needle-format samples).
        extension_tune_n: needle-format tuning samples (default ``tune_n``) of the extensions'
            SEAL-C (Table 2) and of every method of the needle grid (Fig. 5).
    """

    n: int = 50
    lengths: tuple[int, ...] = (40, 80, 120, 160, 200)
    mid: int = 120
    long: int = 160
    sweep_n: int = 30
    confirm_n: int = 160
    replicate_n: int = 600
    channel_heads: int = 2
    tune_n: int = 50
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
    mudaf_lr: float = 1e-4
    head_counts: tuple[int, ...] = (1, 2, 4, 8)
    mask_k: int = 4
    mask_seeds: tuple[int, ...] = (0, 1, 2)
    heatmap_passages: int = 5
    preset: str = "organism"
    index_style: str = "adjective-noun"
    chat_template: str = "none"
    lead_in: bool = False
    needle_n: int = 1
    extension_task: str = "line_retrieval"
    extension_tune_n: int | None = None
    more_questions: int = 0

    def __post_init__(self):
        counts = (self.n, self.sweep_n, self.confirm_n, self.replicate_n, self.tune_n)
        counts += (self.confirm_questions,)
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
        if self.extension_task not in EXTENSION_TASKS:
            raise ValueError(
                f"extension_task must be one of {EXTENSION_TASKS}, got {self.extension_task!r}"
            )

    def as_dict(self) -> dict:
        """The sizes as ``run.json`` and the records' fingerprints hold them.

        The fields added after the organism gallery was first made (``LATER_FIELDS``) are
        written only where they differ from their defaults, the organism's, so that the
        organism gallery's ``run.json`` and stored records, made before those fields existed,
        stay valid.
        """
        d = {k: v for k, v in asdict(self).items() if k != "more_questions"}
        defaults = {f.name: f.default for f in fields(self)}
        return {k: v for k, v in d.items() if k not in LATER_FIELDS or v != defaults[k]}

    @property
    def fresh_questions(self) -> int:
        """MuDAF's fresh questions: ``confirm_questions + more_questions``."""
        return self.confirm_questions + self.more_questions


EXTENSION_TASKS = ("line_retrieval", "needle")
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
)


DEFAULT = FigureSizes()
QUICK = FigureSizes(
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
)


# SmolLM2-135M-Instruct (``load_model("smollm2")``, 8,192 positions). Every size below was
# picked from measurements on the shared 2-core machine, one torch thread (``figures/README.md``
# has the table and the commands):
#
# - format: it retrieves LongEval lines only with integer indices inside its own chat template
#   (``docs/smollm2.md``; adjective-noun indices stay at the floor), and it answers needles and
#   passage questions in a sentence of its own ("The capital of Velmor is ..."), so their
#   answer's lead-in is forced (``lead_in``): needles with the lead-in, 4 of 5 found at 1K
#   tokens and 5 of 5 at 4K (generated, first 12 tokens); without it exact match 0 at 1K.
# - lines: exact match 0.45 / 0.30 / 0.20 / 0.10 at 3 / 5 / 7 / 10 lines (n = 40, 234-366
#   tokens), so ``lengths`` (3, 5, 7, 10); ``mid`` 3 and ``long`` 7 (the sweep's two lengths
#   and the tuning length, where SEAL-H went 0.20 -> 0.625); ``n`` 40 (one standard error
#   <= 0.08; SEAL-H - base at 7 lines is 0.425, far beyond it).
# - sweeps: an exact head sweep costs ~0.35 s per head and record at 3-7 lines (1,867 CPU s
#   for 270 heads x 2 lengths x 10 records), so ``sweep_n`` 20 (~1 hour).
# - fresh records (``confirm_n``, every model): pilots on seed 1 (20 records for Fig. 2b, 40 for
#   Fig. 2d, kept in git history) asked, at 80% power and the pilots' effects, for 155 records
#   (pruning the best head L17H7: +0.05), 50 (the worst, L16H0: -0.15) and 61 (Q1 x 0.9 + Q3 x
#   1.1: +0.12); the organism's for 64 and 77. So 160, on seed 2 (``FRESH_SEED``), which no
#   pilot saw: ~0.3 s per forward at 3-10 lines, ~40 CPU min for Fig. 2b and 2d together.
# - the replication (``replicate_n``, every model): on the 160 fresh records Fig. 2d's effect
#   halved (+0.06, discordant 0.15, McNemar p 0.064), and the power calculation asked for 300
#   records at 80 %; 600 on seed 3 (``REPLICATE_SEED``) give 97 % power at that effect and 80 %
#   at +0.045 (~6 CPU min at 7 lines). The claim is decided on those records alone.
# - needles: a teacher-forced forward costs 2.7 / 6.5 / 17.7 / 33.3 / 52.6 s at 0.9K / 1.9K /
#   3.9K / 5.9K / 7.9K tokens, so the grid goes to the window (1K-8K, 5 depths) with
#   ``needle_n`` 2 needles a cell (~18 min per method).
# - Table 2 runs where SEAL's does, past the trained window: needles at 9K and 12K tokens
#   (``extension_task="needle"``, NTK x2 and Self-Extend G 2 W 1024 reach ~16K); tuning
#   there costs ~200 s per sample (forward + backward), so its SEAL-C tunes on 20 samples
#   (``extension_tune_n``; SEAL Table 4: 10-30 samples give most of the gain).
# - passages: exact match 0.55 at 10 passages (822 tokens), 0.25 at 20 (1,552 tokens), n =
#   20, so ``retrieval_passages`` 20: retrieving, with room both ways (masking, MuDAF).
# - fresh questions (``confirm_questions``, every model): the pilot (``retrieval_n`` 40
#   questions) asked, at 80 % power and its effects, for 433 questions (MuDAF - SFT on the
#   targets' F1, -0.015) and 155-312 (each random draw over the retrieval heads, +0.05 to
#   +0.10), so 440 on seed 2; a teacher-forced forward at 20 passages costs ~5 s, so the
#   confirmation takes ~1.5 CPU h for Fig. 5 (MuDAF, SFT) and ~3 h for Fig. 4 (5 conditions).
# - more fresh questions (``more_questions``): on the 440, Fig. 4's weakest comparison (random
#   draw 1 vs the retrieval heads: +0.03, discordant 0.18) asks for 1,869 questions at 80 %
#   power, so 1,440 more (1,880, 47 chunks): ~10 CPU h for Fig. 4's 5 conditions (and ~4 h for
#   Fig. 5's two models when it is recomputed; its own test asks for 2,577).
SMOLLM2 = FigureSizes(
    preset="smollm2",
    index_style="integers",
    chat_template="tokenizer",
    lead_in=True,
    n=40,
    lengths=(3, 5, 7, 10),
    mid=3,
    long=7,
    sweep_n=20,
    channel_heads=2,
    tune_n=50,
    tune_lines=7,
    lrs=(5e-3, 1e-2, 3e-2),
    sample_counts=(10, 30, 50),
    extension_task="needle",
    extension_lengths=(9000, 12000),
    extension_tune_n=20,
    ntk_factor=2.0,
    se_group=2,
    se_window=1024,
    needle_lengths=(1000, 2000, 4000, 6000, 8000),
    needle_depths=(0, 25, 50, 75, 100),
    needle_n=2,
    retrieval_n=40,
    retrieval_passages=20,
    more_questions=1440,
    mudaf_k=4,
    head_counts=(1, 2, 4, 8),
    mask_k=4,
    mask_seeds=(0, 1, 2),
    heatmap_passages=5,
)
SMOLLM2_QUICK = dataclasses.replace(
    QUICK,
    preset="smollm2-quick",
    index_style="integers",
    chat_template="tokenizer",
    lead_in=True,
    lengths=(3, 7),
    mid=3,
    long=7,
    tune_lines=7,
    extension_task="needle",
    extension_lengths=(400,),
    se_window=128,
    needle_lengths=(300,),
    needle_n=1,
)
PRESETS = {"smollm2": (SMOLLM2, SMOLLM2_QUICK)}


def preset_sizes(model: str, *, quick: bool = False) -> FigureSizes:
    """The sizes for ``model``: its preset in ``PRESETS`` (by the name ``load_model`` takes),
    else the organism's (``DEFAULT``, ``QUICK``)."""
    full, small = PRESETS.get(str(model), (DEFAULT, QUICK))
    return small if quick else full
