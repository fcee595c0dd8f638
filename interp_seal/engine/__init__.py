"""The forward engine: every run of the model that scores answers or starts mid-model.

- ``batch.py``: right-padded ``AnswerBatch`` es and their teacher-forced scores;
- ``forward.py``: ``answer_logits`` (the last layer at answer positions only), ``clean_run`` and
  ``run_from_layer`` (edited runs start at the edited layer; edits batched by ``EditStack``),
  ``run_from_input`` (a layer's attention run again, for attention modes);
- ``layers.py``: recording what enters decoder layers, running them again as the model does;
- ``prefix.py``: ``SharedPrefix``, runs that continue from a common prefix's key/value cache;
- ``decode.py``: ``greedy_decode``, the one generation loop.

Evaluation, sweeps, patching, masking and the dashboard all run here; edits reach it through
one protocol, ``interp_seal.interventions.HeadEdit``.
"""

from interp_seal.engine.batch import AnswerBatch, AnswerScores, pad_id_of
from interp_seal.engine.decode import greedy_decode
from interp_seal.engine.forward import (
    CleanRun,
    EditStack,
    answer_logits,
    clean_run,
    run_from_input,
    run_from_layer,
)
from interp_seal.engine.layers import (
    LayerInputs,
    attn_half,
    attn_output,
    layer_output,
    mlp_half,
    run_layers,
)
from interp_seal.engine.prefix import WHOLE_PROMPT, SharedPrefix, last_logits

__all__ = [
    "WHOLE_PROMPT",
    "AnswerBatch",
    "AnswerScores",
    "CleanRun",
    "EditStack",
    "LayerInputs",
    "SharedPrefix",
    "answer_logits",
    "attn_half",
    "attn_output",
    "clean_run",
    "greedy_decode",
    "last_logits",
    "layer_output",
    "mlp_half",
    "pad_id_of",
    "run_from_input",
    "run_from_layer",
    "run_layers",
]
