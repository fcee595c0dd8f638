"""How big each figure's experiment is: the default (the committed organism gallery) and ``--quick``.

SEAL's lengths are numbers of LongEval lines (``max_position_embeddings`` is 4,096); MuDAF's
sizes are numbers of passages of the synthetic multi-document QA (``interp_seal.tasks.passages``,
1-hop). Every number of records per point is written on the gallery page next to the result it
produced.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

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
        channel_heads: heads opened in the channel sweep (SEAL Fig. 2c): the ones whose
            pruning hurts most at ``long``.
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
        mudaf_k: target heads drawn for MuDAF; mudaf_lr: its learning rate (and SFT's).
        head_counts: MuDAF Table 4 / Fig. 7's numbers of selected heads.
        mask_k, mask_seeds: MuDAF Fig. 4's masked-head count and random draws.
        heatmap_passages: passages of the MuDAF Fig. 10 question.
    """

    n: int = 50
    lengths: tuple[int, ...] = (40, 80, 120, 160, 200)
    mid: int = 120
    long: int = 160
    sweep_n: int = 30
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
    mudaf_k: int = 4
    mudaf_lr: float = 1e-4
    head_counts: tuple[int, ...] = (1, 2, 4, 8)
    mask_k: int = 4
    mask_seeds: tuple[int, ...] = (0, 1, 2)
    heatmap_passages: int = 5

    def __post_init__(self):
        if self.mid >= self.long or min(self.n, self.sweep_n, self.tune_n) < 1:
            raise ValueError(
                f"sizes need mid < long and at least one record per point (mid={self.mid}, "
                f"long={self.long}, n={self.n}, sweep_n={self.sweep_n}, tune_n={self.tune_n})"
            )
        for p in (self.retrieval_passages, self.heatmap_passages):
            PassagesConfig(num_passages=p)  # refuses a count outside 2..MAX_PASSAGES
        if max(self.sample_counts) > self.tune_n:
            raise ValueError(
                f"sample_counts {self.sample_counts} exceed tune_n={self.tune_n}; Table 4's "
                "subsets are drawn from the tuning samples"
            )

    def as_dict(self) -> dict:
        return asdict(self)


DEFAULT = FigureSizes()
QUICK = FigureSizes(
    n=4,
    lengths=(6, 12),
    mid=6,
    long=12,
    sweep_n=3,
    channel_heads=1,
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
    mudaf_k=2,
    head_counts=(1, 2),
    mask_k=2,
    mask_seeds=(0,),
    heatmap_passages=3,
)
