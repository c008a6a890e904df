"""The exercises of notebook 09: their checks (hidden parts included, as the grader runs
them) pass the instructor's solution and answers written another way, and fail the usual
mistakes with feedback that names the mistake.

Each check cell runs after the notebook's imports, knobs and model cells, with the
learner's function defined in the same namespace.
"""

from __future__ import annotations

import math
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F
from notebook_cells import grade_cell
from torch import nn

from course_utils.classroom import CheckFailed

ROOT = Path(__file__).resolve().parent.parent
NB09 = ROOT / "notebooks" / "09_transformers_on_the_gpu.ipynb"
# the cells a check needs, by how they start: imports, knobs, the model
SETUP = ("import contextlib", "from course_utils.cla", "# the model:",  # claims, classroom
         "class CausalSelfAttention", "class Block", "class GPT")


def _code_cells() -> list[nbformat.NotebookNode]:
    notebook = nbformat.read(NB09, as_version=4)
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _check_cell(grade_id: str) -> str:
    return grade_cell(NB09, grade_id)

@pytest.fixture(scope="module")
def namespace() -> dict:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COURSE_WORKLOAD", "small")
        found: dict = {}
        for cell in _code_cells():
            for start in SETUP:
                if cell.source.startswith(start):
                    found[start] = cell.source
        assert set(found) == set(SETUP), f"setup cells not found: {set(SETUP) - set(found)}"
        names: dict = {}
        for start in SETUP:
            exec(found[start], names)
        return names


def _run(namespace: dict, grade_id: str, name: str, solution) -> None:
    names = dict(namespace, **{name: solution})
    exec(_check_cell(grade_id), names)


def _passes(namespace, grade_id, name, solution, capsys) -> None:
    _run(namespace, grade_id, name, solution)
    assert "all checks passed" in capsys.readouterr().out


def _fails(namespace, grade_id, name, solution, feedback: str) -> None:
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, grade_id, name, solution)
    assert feedback in str(failure.value), str(failure.value)


# ----------------------------------------------------------------------------- (a)


def _heads(t, heads):
    batch, seq, dim = t.shape
    return t.view(batch, seq, heads, dim // heads).transpose(1, 2)


def _merge(t):
    batch, heads, seq, head_dim = t.shape
    return t.transpose(1, 2).reshape(batch, seq, heads * head_dim)


def _attention(x, w_qkv, w_out, heads, attend):
    q, k, v = (_heads(t, heads) for t in (x @ w_qkv.T).chunk(3, dim=-1))
    return _merge(attend(q, k, v)) @ w_out.T


def causal_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_attention(x, w_qkv, w_out, heads):
    return _attention(x, w_qkv, w_out, heads, causal_sdpa)


def by_hand(q, k, v, scale=None, diagonal=1):
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    hidden = torch.ones(T, T, dtype=torch.bool).triu(diagonal)
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ v


def naive_attention(x, w_qkv, w_out, heads):  # right, written out by hand
    return _attention(x, w_qkv, w_out, heads, by_hand)


def linear_and_mask_attention(x, w_qkv, w_out, heads):  # right: F.linear, a boolean mask
    def attend(q, k, v):
        allowed = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

    q, k, v = (_heads(t, heads) for t in F.linear(x, w_qkv).split(x.shape[-1], dim=-1))
    return F.linear(_merge(attend(q, k, v)), w_out)


def not_causal(x, w_qkv, w_out, heads):
    return _attention(x, w_qkv, w_out, heads, F.scaled_dot_product_attention)


def scaled_by_d(x, w_qkv, w_out, heads):
    return _attention(x, w_qkv, w_out, heads, lambda q, k, v: by_hand(q, k, v, 1 / q.shape[-1]))


def scaled_twice(x, w_qkv, w_out, heads):  # divides by √d and lets SDPA divide again
    def attend(q, k, v):
        q = q / math.sqrt(q.shape[-1])
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return _attention(x, w_qkv, w_out, heads, attend)


def not_scaled(x, w_qkv, w_out, heads):
    return _attention(x, w_qkv, w_out, heads, lambda q, k, v: by_hand(q, k, v, 1.0))


def sees_the_next_token(x, w_qkv, w_out, heads):
    return _attention(x, w_qkv, w_out, heads, lambda q, k, v: by_hand(q, k, v, diagonal=2))


def hides_the_diagonal(x, w_qkv, w_out, heads):
    return _attention(x, w_qkv, w_out, heads, lambda q, k, v: by_hand(q, k, v, diagonal=0))


def wrong_head_split(x, w_qkv, w_out, heads):  # .view(batch, heads, seq, head_dim): mixes tokens
    batch, seq, dim = x.shape
    q, k, v = (t.reshape(batch, heads, seq, dim // heads) for t in (x @ w_qkv.T).chunk(3, -1))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(batch, seq, dim) @ w_out.T


def no_output_projection(x, w_qkv, w_out, heads):
    return sdpa_attention(x, w_qkv, torch.eye(x.shape[-1]), heads)


def returns_a_tuple(x, w_qkv, w_out, heads):
    return sdpa_attention(x, w_qkv, w_out, heads), None


@pytest.mark.parametrize("solution", [sdpa_attention, naive_attention, linear_and_mask_attention])
def test_causal_attention_check_passes_right_answers(namespace, solution, capsys):
    _passes(namespace, "09-causal-attention-check", "causal_self_attention", solution, capsys)


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (not_causal, "pass is_causal=True"),
        (scaled_by_d, "scaled by 1/head_dim"),
        (scaled_twice, "scaled by 1/head_dim"),
        (not_scaled, "not scaled"),
        (sees_the_next_token, "off by one"),
        (hides_the_diagonal, "attend to itself"),
        (wrong_head_split, "split heads with .view(batch, seq, heads, head_dim)"),
        (no_output_projection, "project with w_out"),
        (returns_a_tuple, "return one tensor"),
    ],
)
def test_causal_attention_check_names_the_mistake(namespace, solution, feedback):
    _fails(namespace, "09-causal-attention-check", "causal_self_attention", solution, feedback)


# ----------------------------------------------------------------------------- (b)


def _pad(model, padded, *, copy=True, tie=True, rows_init=None):
    old = model.tok.weight
    vocab, dim = old.shape
    model.tok = nn.Embedding(padded, dim)
    with torch.no_grad():
        if rows_init is not None:
            model.tok.weight[vocab:] = rows_init
        if copy:
            model.tok.weight[:vocab] = old
    model.head = nn.Linear(dim, padded, bias=False)
    if tie:
        model.head.weight = model.tok.weight
    return model


def pad_right(model, multiple=64):
    return _pad(model, math.ceil(model.tok.num_embeddings / multiple) * multiple)


def pad_with_integer_arithmetic(model, multiple=64):  # right: -(-v // m) * m, zero rows
    vocab, dim = model.tok.weight.shape
    padded = -(-vocab // multiple) * multiple
    weight = torch.cat([model.tok.weight.detach(), torch.zeros(padded - vocab, dim)])
    model.tok = nn.Embedding.from_pretrained(weight, freeze=False)
    model.head.weight = model.tok.weight
    return model


def pad_by_adding(model, multiple=64):  # adds a multiple instead of rounding up
    return _pad(model, model.tok.num_embeddings + multiple)


def pad_always_one_more(model, multiple=64):  # 64 -> 128
    return _pad(model, (model.tok.num_embeddings // multiple + 1) * multiple)


def pad_untied(model, multiple=64):
    return _pad(model, math.ceil(model.tok.num_embeddings / multiple) * multiple, tie=False)


def pad_not_copied(model, multiple=64):  # a fresh embedding: every logit changes
    return _pad(model, math.ceil(model.tok.num_embeddings / multiple) * multiple, copy=False)


def pad_with_nan_rows(model, multiple=64):
    padded = math.ceil(model.tok.num_embeddings / multiple) * multiple
    return _pad(model, padded, rows_init=float("nan"))


def pad_the_width(model, multiple=64):  # pads embedding_dim, not the vocabulary
    old = model.tok.weight
    vocab, dim = old.shape
    model.tok = nn.Embedding(vocab, math.ceil(dim / multiple) * multiple)
    model.head.weight = model.tok.weight
    return model


def pad_returns_nothing(model, multiple=64):
    pad_right(model, multiple)


@pytest.mark.parametrize("solution", [pad_right, pad_with_integer_arithmetic])
def test_pad_vocabulary_check_passes_right_answers(namespace, solution, capsys):
    _passes(namespace, "09-pad-vocabulary-check", "pad_vocabulary", solution, capsys)


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (pad_by_adding, "round up to the next multiple"),
        (pad_always_one_more, "keep one that is already"),
        (pad_untied, "no longer tied"),
        (pad_not_copied, "copy the old rows"),
        (pad_with_nan_rows, "inf or NaN"),
        (pad_the_width, "not the embedding width"),
        (pad_returns_nothing, "return the model"),
    ],
)
def test_pad_vocabulary_check_names_the_mistake(namespace, solution, feedback):
    _fails(namespace, "09-pad-vocabulary-check", "pad_vocabulary", solution, feedback)


# ----------------------------------------------------------------------------- (c)

PEAKS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def throughput_right(flops, tokens, seconds, gpu, dtype):
    peak = getattr(gpu, PEAKS[dtype])
    if peak is None:
        raise ValueError("no peak")
    return tokens / seconds, flops / seconds / (peak * 1e12)


def throughput_via_package(flops, tokens, seconds, gpu, dtype):  # right, another way
    from course_utils.flops import mfu

    tflops = {torch.float32: gpu.fp32, torch.float16: gpu.fp16, torch.bfloat16: gpu.bf16}[dtype]
    if not tflops:
        raise ValueError(f"{gpu.name}: no {dtype} peak")
    return tokens / seconds, mfu(flops, seconds, tflops * 1e12)


def throughput_percent(flops, tokens, seconds, gpu, dtype):
    speed, utilization = throughput_right(flops, tokens, seconds, gpu, dtype)
    return speed, 100 * utilization


def throughput_tflops(flops, tokens, seconds, gpu, dtype):
    peak = getattr(gpu, PEAKS[dtype])
    if peak is None:
        raise ValueError("no peak")
    return tokens / seconds, flops / seconds / peak


def throughput_fp32_peak(flops, tokens, seconds, gpu, dtype):
    return tokens / seconds, flops / seconds / (gpu.fp32 * 1e12)


def throughput_inverted(flops, tokens, seconds, gpu, dtype):
    return seconds / tokens, throughput_right(flops, tokens, seconds, gpu, dtype)[1]


def throughput_no_refusal(flops, tokens, seconds, gpu, dtype):
    peak = getattr(gpu, PEAKS[dtype]) or gpu.fp16  # falls back to another peak silently
    return tokens / seconds, flops / seconds / (peak * 1e12)


def throughput_type_error(flops, tokens, seconds, gpu, dtype):
    peak = getattr(gpu, PEAKS[dtype])
    return tokens / seconds, flops / seconds / (peak * 1e12)  # None * 1e12: TypeError


def throughput_rounded(flops, tokens, seconds, gpu, dtype):  # issue 35: MFU rounded to 2 places
    speed, utilization = throughput_right(flops, tokens, seconds, gpu, dtype)
    return speed, round(utilization, 2)


def throughput_one_number(flops, tokens, seconds, gpu, dtype):
    return throughput_right(flops, tokens, seconds, gpu, dtype)[1]


@pytest.mark.parametrize("solution", [throughput_right, throughput_via_package])
def test_run_throughput_check_passes_right_answers(namespace, solution, capsys):
    _passes(namespace, "09-run-throughput-check", "run_throughput", solution, capsys)


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (throughput_percent, "not a percentage"),
        (throughput_tflops, "multiply them by 1e12"),
        (throughput_fp32_peak, "divides by the bf16 peak"),
        (throughput_inverted, "tokens per second"),
        (throughput_no_refusal, "raise ValueError (yours returned"),
        (throughput_type_error, "raise ValueError (yours raised TypeError)"),
        (throughput_one_number, "return two numbers"),
        (throughput_rounded, "return it unrounded"),
    ],
)
def test_run_throughput_check_names_the_mistake(namespace, solution, feedback):
    _fails(namespace, "09-run-throughput-check", "run_throughput", solution, feedback)


def test_the_instructor_solutions_pass_their_checks(namespace, capsys):
    """The solution cells themselves, as the notebook has them."""
    cells = _code_cells()
    for grade_id in ("09-causal-attention", "09-pad-vocabulary", "09-run-throughput"):
        solution = next(
            c for c in cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
        )
        names = dict(namespace)
        exec(solution.source, names)
        exec(_check_cell(grade_id + "-check"), names)
    assert capsys.readouterr().out.count("all checks passed") == 3
