"""The bundled model organism: a small Llama trained here to retrieve in three task formats.

- ``tokenizer.py``: the word-level tokenizer (one token per line index, per digit, per word).
- ``train.py``: v1's recipe (induction-head bootstrap + gap curriculum), resumable.
- ``mixture.py``: v2's recipe, continuing v1 on lines, needles in haystacks and passage QA.
- ``card.py``, ``card_tasks.py``: the model card's measurements (lines, pruning; needles,
  passages, retrieval heads, masking, SEAL-H).
- ``checkpoint/``: the shipped model (v2), loaded by ``interp_seal.models.load_model("organism")``.
- ``checkpoint_v1/``: v1 (line retrieval only), the base ``mixture.py`` continues from.
"""
