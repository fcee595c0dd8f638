"""The bundled model organism: a small Llama trained here to retrieve lines.

- ``tokenizer.py``: the word-level tokenizer (one token per line index, per digit).
- ``train.py``: the training recipe (induction-head bootstrap + gap curriculum), resumable.
- ``card.py``: accuracy-vs-length and per-head pruning measurements; the model card.
- ``checkpoint/``: the shipped model, loaded by ``interp_seal.models.load_model("organism")``.
"""
