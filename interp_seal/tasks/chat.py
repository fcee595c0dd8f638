"""Chat templates: a task prompt wrapped in a model's conversation format.

Instruct models are evaluated inside their conversation format. LongChat's LongEval (the
protocol SEAL reports for chat models) wraps each test prompt in the model's fastchat
conversation template and lets the model answer as the assistant; for LongChat models that is
fastchat's ``vicuna`` v1.1 conversation::

    A chat between a curious user and an artificial intelligence assistant. The assistant gives
    helpful, detailed, and polite answers to the user's questions. USER: {prompt} ASSISTANT:

(the system message, ``sep=" "``, then ``"USER: " + prompt + sep + "ASSISTANT:"``). A model
from the hub brings its own template in its tokenizer (``tokenizer.chat_template``, a Jinja
template rendered by ``apply_chat_template``): SmolLM2-135M-Instruct's writes
``<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n`` after a default system turn.

``wrap_sample(sample, template, tokenizer)`` takes a task sample and returns the sample a chat
model reads, for ``template``:

- ``"none"``: the sample unchanged (base models; the organism);
- ``"tokenizer"``: the tokenizer's own template, one user turn and the assistant turn opened
  (``add_generation_prompt=True``);
- a name in ``NAMED_TEMPLATES`` (``"vicuna"``).

The user turn holds the task prompt without its *answer prefix*, the part of SEAL's answer string
that teacher-forced evaluation forces after the prompt (``"\\nThe <REGISTER_CONTENT> in line X
is"`` for LongEval, see ``line_retrieval``): the prefix belongs to the assistant, so it goes after
the assistant turn, and the answer follows it as before. Without a prefix the answer itself opens
the assistant's reply. Passage and needle character spans are shifted by the text the template
puts before the prompt, so ``Sample.encode`` finds their tokens in the wrapped prompt.

The tokenizer's template is rendered by transformers in jinja2's sandbox, in a thread stopped
after ``RENDER_SECONDS``: a template that fails, or loops for hours, is an error naming the
template and the fix. A template must copy the prompt verbatim; one that drops or rewrites it
(a template without the message content, one that trims or escapes it) is refused with an
error before any forward. When the tokenizer adds BOS by itself and the rendered template
starts with the BOS text, that text is dropped (``apply_chat_template`` tokenises without
special tokens; ``Sample.encode`` with them), so BOS appears once either way.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from collections.abc import Callable, Iterable

from interp_seal.defaults import CHAT_TEMPLATES
from interp_seal.tasks import line_retrieval
from interp_seal.tasks.sample import Sample

VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the user's questions."
)
NAMED_TEMPLATES = {"vicuna": VICUNA_SYSTEM + " USER: {prompt} ASSISTANT:"}
RENDER_SECONDS = 5.0
"""The most one message's rendering may take (a real template takes milliseconds; transformers
renders in jinja2's sandbox, which stops attribute tricks but not a loop of 10^10 steps)."""
TEMPLATES = CHAT_TEMPLATES  # "none", "tokenizer", then NAMED_TEMPLATES' names
assert TEMPLATES == ("none", "tokenizer", *NAMED_TEMPLATES)


def check_template(template: str, tokenizer=None) -> None:
    """Raise ValueError for an unknown template, or ``"tokenizer"`` on a tokenizer without one."""
    if template not in TEMPLATES:
        raise ValueError(
            f"unknown chat template {template!r}; choose 'none' (the raw prompt), 'tokenizer' "
            f"(the model's own template) or a named one: {', '.join(NAMED_TEMPLATES)}"
        )
    if template == "tokenizer" and tokenizer is not None and not tokenizer.chat_template:
        raise ValueError(
            "chat template 'tokenizer' asked for, but this tokenizer has no chat_template (a base "
            "model?); use 'none', or a named template such as 'vicuna'"
        )


def answer_prefix(sample: Sample) -> str:
    """The part of ``sample.prompt`` that is the start of the answer (``""`` if none)."""
    if sample.task == "line_retrieval" and sample.meta.get("force_prefix"):
        return line_retrieval.ANSWER_PREFIX.format(idx=sample.meta["random_idx"][0])
    return sample.meta.get("answer_prefix", "")


def force_prefix(sample: Sample, prefix: str) -> Sample:
    """``sample`` with ``prefix``, the start of the answer, forced after its prompt.

    LongEval's records do this themselves (``force_prefix``); for other tasks it turns a
    question into a completion (``" The capital of Velmor is"`` before the answer ``" Lora"``),
    so teacher-forced exact match scores the fact, not the wording a model opens its reply
    with. ``wrap_sample`` puts the prefix after the assistant turn. ``""`` changes nothing.
    """
    if not prefix:
        return sample
    if "chat_template" in sample.meta:
        raise ValueError("force the answer prefix before wrapping the sample in a chat template")
    meta = {**sample.meta, "answer_prefix": prefix}
    return dataclasses.replace(sample, prompt=sample.prompt + prefix, meta=meta)


def render(template: str, prompt: str, tokenizer) -> str:
    """The conversation text of one user turn ``prompt`` with the assistant's turn opened."""
    if template in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[template].replace("{prompt}", prompt)
    text = _within_time(
        lambda: tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        ),
        f"the chat template of {tokenizer.name_or_path}",
    )
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos) :]
    return text


class _Stopped(BaseException):
    """Raised inside a rendering thread that ran past ``RENDER_SECONDS``."""


def _within_time(render: Callable[[], str], what: str) -> str:
    """``render()`` in a thread of its own, stopped after ``RENDER_SECONDS``; any failure of
    the template is a ``ValueError`` naming ``what`` and the fix."""
    fix = (
        "fix the template (chat_template.jinja or tokenizer_config.json's chat_template), or "
        "use --chat-template none or vicuna"
    )
    result: dict = {}

    def run() -> None:
        try:
            result["text"] = render()
        except Exception as err:  # a template can raise anything: reported below
            result["error"] = err
        except _Stopped:
            pass

    worker = threading.Thread(target=run, name="chat-template", daemon=True)
    worker.start()
    worker.join(RENDER_SECONDS)
    if worker.is_alive():  # stop it at its next bytecode (templates are compiled to Python)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(worker.ident), ctypes.py_object(_Stopped)
        )
        worker.join(1.0)
        raise ValueError(
            f"{what} did not finish rendering one message in {RENDER_SECONDS:g} s (a loop that "
            f"never ends?); {fix}"
        )
    if "error" in result:
        err = result["error"]
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"{what} failed ({type(err).__name__}: {reason}); {fix}")
    return result["text"]


def _adds_bos(tokenizer) -> bool:
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def _after(turn: str, text: str) -> str:
    """``text`` continuing ``turn``: one space after ``ASSISTANT:``, none after a newline."""
    text = text.lstrip()
    return text if not turn or turn[-1].isspace() else " " + text


def wrap_sample(sample: Sample, template: str, tokenizer) -> Sample:
    """``sample`` as a chat model reads it under ``template`` (see the module docstring)."""
    check_template(template, tokenizer)
    if template == "none":
        return sample
    if "chat_template" in sample.meta:
        raise ValueError(
            f"this sample is already wrapped in the {sample.meta['chat_template']!r} chat template; "
            "wrap the task's own samples once"
        )
    prefix = answer_prefix(sample)
    user = sample.prompt[: len(sample.prompt) - len(prefix)]
    text = render(template, user, tokenizer)
    start = text.find(user)
    if not user or start < 0:
        raise ValueError(
            f"chat template {template!r} does not copy the prompt verbatim into the conversation "
            f"(rendered {text[:120]!r}...); the task's spans and answer would be lost. Use a "
            "template that inserts the message content unchanged, or 'none'."
        )
    if prefix:
        prompt, answer = text + _after(text, prefix), sample.answer
    else:
        prompt, answer = text, _after(text, sample.answer)
    shift = [(a + start, b + start) for a, b in sample.passages]
    needle = (sample.needle[0] + start, sample.needle[1] + start) if sample.needle else None
    return dataclasses.replace(
        sample,
        prompt=prompt,
        answer=answer,
        passages=tuple(shift),
        needle=needle,
        meta={**sample.meta, "chat_template": template},
    )


def wrap_samples(samples: Iterable[Sample], template: str, tokenizer) -> list[Sample]:
    """``wrap_sample`` on each of ``samples``."""
    check_template(template, tokenizer)
    return [wrap_sample(s, template, tokenizer) for s in samples]
