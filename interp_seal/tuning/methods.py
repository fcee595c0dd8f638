"""The tuning methods, one row each: the name results carry, the ``interp-seal tune`` command,
the default learning rate, and what the method trains.

The CLI (``interp_seal.cli.tune``), the figure gallery (``interp_seal.figures.run``) and the
docs read this table, so a method has one name and one default everywhere. Names follow the
papers: SEAL-H / SEAL-C learn one scale per head / per channel (SEAL Sec. 4), SEAL-L / SEAL-D
are SEAL's LoRA / DoRA baselines (commands ``lora`` / ``dora``), MuDAF trains selected heads'
queries and keys contrastively with the LM loss (MuDAF Sec. 3), SFT is its Vanilla SFT baseline.
The learning rates are the defaults every command and figure uses (``--lr`` overrides them).

MuDAF's paper trains at 5e-6 (App. B: full fine-tuning of Llama-3.1-8B on its whole MDQA
training set). The jobs here tune on ~50 samples for one epoch, SEAL's regime, where that rate
does not move the model: on the organism (MuDAF on 2 heads, alpha 0.5, 50 line records of 40
lines) the held-out answer log-probability went from -0.556 (base) to -0.552 at 5e-6 and to
-0.492 at 1e-4. So MuDAF and its SFT baseline default to 1e-4 everywhere; pass ``--lr 5e-6``
(``TrainConfig(lr=5e-6)``) to train at the paper's rate on a paper-sized set.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Method:
    """One tuning method.

    Attributes:
        name: what results, logs, scale files and figures call it.
        command: its ``interp-seal tune`` sub-command.
        lr: the default AdamW learning rate (constant).
        summary: what it trains, one line (the command's help).
    """

    name: str
    command: str
    lr: float
    summary: str


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            name="seal-h", command="seal-h", lr=1e-2, summary="SEAL-H: one learnable scale per head"
        ),
        Method(
            name="seal-c",
            command="seal-c",
            lr=2e-2,
            summary="SEAL-C: one learnable scale per channel",
        ),
        Method(name="seal-l", command="lora", lr=2e-4, summary="SEAL-L: LoRA on q/k/v/o"),
        Method(name="seal-d", command="dora", lr=2e-4, summary="SEAL-D: DoRA on q/k/v/o"),
        Method(
            name="mudaf",
            command="mudaf",
            lr=1e-4,
            summary="MuDAF contrastive attention focusing + LM loss",
        ),
        Method(name="sft", command="sft", lr=1e-4, summary="Vanilla SFT baseline (LM loss only)"),
    )
}


def by_command(command: str) -> Method:
    """The method ``interp-seal tune COMMAND`` runs."""
    for method in METHODS.values():
        if method.command == command:
            return method
    raise KeyError(f"no tuning method has the command {command!r}")
