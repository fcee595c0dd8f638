"""Chat templates: LongChat's vicuna conversation, the tokenizer's own template, spans, errors."""

from __future__ import annotations

import pytest
import torch
from conftest import byte_level_tokenizer
from tokenizers import processors

from interp_seal.evaluation import evaluate_line_retrieval, teacher_force
from interp_seal.models import load_model
from interp_seal.tasks import LineRetrievalConfig, PassagesConfig, line_retrieval, passages
from interp_seal.tasks.chat import wrap_sample, wrap_samples
from interp_seal.testing import save_random_checkpoint

# fastchat's vicuna_v1.1 conversation, written out by hand
VICUNA = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the user's questions. USER: "
)
# SmolLM2-135M-Instruct's template (ChatML with a default system turn)
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    tokenizer = byte_level_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    return tokenizer


def line_sample(force_prefix=True):
    cfg = LineRetrievalConfig(num_lines=4, force_prefix=force_prefix)
    return line_retrieval.generate(cfg, 1, seed=3)[0]


def test_vicuna_puts_the_answer_prefix_after_the_assistant_turn(tok):
    sample = line_sample()
    idx, value = sample.meta["random_idx"][0], sample.meta["expected_number"]
    question = sample.prompt.removesuffix(f"\nThe <REGISTER_CONTENT> in line {idx} is")
    assert question.endswith("I need the number.")
    wrapped = wrap_sample(sample, "vicuna", tok)
    assert wrapped.prompt == (
        f"{VICUNA}{question} ASSISTANT: The <REGISTER_CONTENT> in line {idx} is"
    )
    assert wrapped.answer == f" {value}." == sample.answer
    enc = wrapped.encode(tok)
    assert tok.decode(enc.answer_ids) == f" {value}."
    assert tok.decode(enc.prompt_ids) == wrapped.prompt

    whole = line_sample(force_prefix=False)
    wrapped = wrap_sample(whole, "vicuna", tok)
    assert wrapped.prompt == f"{VICUNA}{whole.prompt} ASSISTANT:"
    assert wrapped.answer == f" The <REGISTER_CONTENT> in line {idx} is {value}."


def test_tokenizer_template_gives_apply_chat_template_ids(tok):
    sample = line_sample()
    idx = sample.meta["random_idx"][0]
    question = sample.prompt.removesuffix(f"\nThe <REGISTER_CONTENT> in line {idx} is")
    chat_ids = tok.apply_chat_template(
        [{"role": "user", "content": question}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    enc = wrap_sample(sample, "tokenizer", tok).encode(tok)
    prefix_ids = tok(f"The <REGISTER_CONTENT> in line {idx} is", add_special_tokens=False)
    assert enc.prompt_ids.tolist() == list(chat_ids) + prefix_ids["input_ids"]
    assert tok.convert_ids_to_tokens(enc.input_ids[:1]) == ["<|im_start|>"]


def test_bos_in_the_template_is_not_doubled(tok):
    bos_tok = byte_level_tokenizer()
    bos_tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos_tok.bos_token_id)]
    )
    bos_tok.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    sample = line_sample(force_prefix=False)
    assert bos_tok(sample.prompt)["input_ids"][0] == bos_tok.bos_token_id  # it adds BOS itself
    enc = wrap_sample(sample, "tokenizer", bos_tok).encode(bos_tok)
    chat_ids = bos_tok.apply_chat_template(
        [{"role": "user", "content": sample.prompt}], tokenize=True, return_dict=False
    )
    assert enc.prompt_ids.tolist() == list(chat_ids)
    assert enc.prompt_ids.tolist().count(bos_tok.bos_token_id) == 1


def test_passage_spans_follow_the_prompt_into_the_template(tok):
    sample = passages.generate(PassagesConfig(num_passages=3), 1, seed=0)[0]
    for template in ("vicuna", "tokenizer"):
        wrapped = wrap_sample(sample, template, tok)
        shift = wrapped.prompt.index(sample.prompt)
        assert shift > 0 and wrapped.golden == sample.golden
        for (a, b), (c, d) in zip(sample.passages, wrapped.passages, strict=True):
            assert (c - shift, d - shift) == (a, b)
            assert wrapped.prompt[c:d] == sample.prompt[a:b]
        enc, plain = wrapped.encode(tok), sample.encode(tok)
        for (a, b), (c, d) in zip(plain.passages, enc.passages, strict=True):
            assert enc.input_ids[c:d].tolist() == plain.input_ids[a:b].tolist()


def test_bad_templates_are_refused(tok):
    sample = line_sample()
    with pytest.raises(ValueError, match="unknown chat template 'alpaca'.*vicuna"):
        wrap_sample(sample, "alpaca", tok)
    dropping = byte_level_tokenizer()
    dropping.chat_template = "{% for m in messages %}[{{ m['role'] }}]{% endfor %}[assistant]"
    with pytest.raises(ValueError, match="does not copy the prompt verbatim"):
        wrap_samples([sample], "tokenizer", dropping)
    with pytest.raises(ValueError, match="has no chat_template"):
        wrap_sample(sample, "tokenizer", byte_level_tokenizer())
    with pytest.raises(ValueError, match="already wrapped"):
        wrap_sample(wrap_sample(sample, "vicuna", tok), "vicuna", tok)
    assert wrap_sample(sample, "none", tok) is sample


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory, tok):
    path = save_random_checkpoint(tmp_path_factory.mktemp("bpe"), "llama", tokenizer=tok)
    return load_model(path)


def test_evaluation_wraps_samples_and_first_token_skips_the_space(bpe_model):
    tok = bpe_model.tokenizer
    samples = line_retrieval.generate(LineRetrievalConfig(num_lines=3), 4, seed=0)
    wrapped = wrap_samples(samples, "vicuna", tok)
    scores = teacher_force(bpe_model, wrapped)
    table = evaluate_line_retrieval(bpe_model, [3], n=4, seed=0, chat_template="vicuna")
    row = table.iloc[0]
    assert row.n_tokens == sum(s.n_tokens for s in scores) / 4
    assert row.exact_match == sum(s.exact_match for s in scores) / 4
    assert row.answer_logprob == pytest.approx(sum(s.answer_logprob for s in scores) / 4)
    for sample, score in zip(wrapped, scores, strict=True):
        pieces = tok.convert_ids_to_tokens(sample.encode(tok).answer_ids)
        assert pieces[0] == "Ġ"  # " 12345." starts with a bare space on byte-level BPE
        assert score.first_content == 1
        assert score.first_token == score.token_correct[1]
    # the predicted token at the content position is the model's argmax there, by hand
    enc = wrapped[0].encode(tok)
    with torch.no_grad():
        logits = bpe_model.model(enc.input_ids[None]).logits[0]
    assert logits[enc.answer_start].argmax() == scores[0].predicted[1]


def test_sweep_and_tuning_commands_wrap_their_records(bpe_model, tmp_path):
    import pandas as pd

    from interp_seal.cli import main

    model = bpe_model.name_or_path
    common = ["--model", model, "--lengths", "3", "--n", "2", "--chat-template", "vicuna"]
    assert (
        main(["analysis", "head-sweep", *common, "--heads", "0.1", "--out", str(tmp_path / "s")])
        == 0
    )
    samples = line_retrieval.generate(LineRetrievalConfig(num_lines=3), 2, seed=0)
    scores = teacher_force(bpe_model, wrap_samples(samples, "vicuna", bpe_model.tokenizer))
    sweep = pd.read_csv(tmp_path / "s" / "results.csv").set_index("metric")
    exact = sum(s.exact_match for s in scores) / 2
    logprob = sum(s.answer_logprob for s in scores) / 2
    assert sweep.loc["exact_match", "baseline"] == exact
    assert sweep.loc[sweep.index != "exact_match", "baseline"].iloc[0] == pytest.approx(logprob)
    assert main(["tune", "evaluate", *common, "--out", str(tmp_path / "t")]) == 0
    tuned = pd.read_csv(tmp_path / "t" / "accuracy.csv")
    assert tuned.loc[0, "method"] == "base" and tuned.loc[0, "exact_match"] == exact
    assert tuned.loc[0, "answer_logprob"] == pytest.approx(logprob)
    with pytest.raises(SystemExit):  # argparse refuses an unknown template before any work
        main(["evaluate", "lines", "--model", model, "--chat-template", "alpaca"])
