"""The exercises of notebook 09: their checks (hidden parts included, as the grader runs
them) pass the instructor's solution and answers written another way, and fail the usual
mistakes with feedback that names the mistake.

Each check cell runs after the notebook's imports, knobs and model cells, with the
learner's function defined in the same namespace.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F
from notebook_cells import grade_apart, grade_cell, messages_matching
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from course_utils.checks.evidence.nb09 import step_inputs
from course_utils.checks.nb09 import MESSAGES_09
from course_utils.feedback import CheckFailed

ROOT = Path(__file__).resolve().parent.parent
NB09 = ROOT / "notebooks" / "09_transformers_on_the_gpu.ipynb"
# the cells a check needs, by how they start: imports, knobs, the model
SETUP = (
    "import contextlib",
    "from course_utils.cla",
    "# GPU memory (MiB) each",  # sized()
    "# the model:",
    "class CausalSelfAttention",
    "class Block",
    "class GPT",
)


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


def scaled_by_width(x, w_qkv, w_out, heads):  # 1/√dim, the model's width, not head_dim
    scale = x.shape[-1] ** -0.5
    return _attention(x, w_qkv, w_out, heads, lambda q, k, v: by_hand(q, k, v, scale))


def sees_the_next_token(x, w_qkv, w_out, heads):
    return _attention(x, w_qkv, w_out, heads, lambda q, k, v: by_hand(q, k, v, diagonal=2))


def hides_the_diagonal(x, w_qkv, w_out, heads):
    return _attention(x, w_qkv, w_out, heads, lambda q, k, v: by_hand(q, k, v, diagonal=0))


def hides_the_diagonal_finite(x, w_qkv, w_out, heads):  # -1e9, not -inf: no NaN, still wrong
    def attend(q, k, v):
        T = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(0), -1e9)
        return scores.softmax(-1) @ v

    return _attention(x, w_qkv, w_out, heads, attend)


def hides_the_past(x, w_qkv, w_out, heads):  # tril where triu was meant
    def attend(q, k, v):
        T = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).tril(-1), float("-inf"))
        return scores.softmax(-1) @ v

    return _attention(x, w_qkv, w_out, heads, attend)


def mask_with_zeros(x, w_qkv, w_out, heads):
    def attend(q, k, v):
        T = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), 0).softmax(-1) @ v

    return _attention(x, w_qkv, w_out, heads, attend)


def mask_after_softmax(x, w_qkv, w_out, heads):
    def attend(q, k, v):
        T = q.shape[-2]
        weights = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1)
        return weights.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), 0) @ v

    return _attention(x, w_qkv, w_out, heads, attend)


def inverted_boolean_mask(x, w_qkv, w_out, heads):  # SDPA's True means "may attend"
    def attend(q, k, v):
        hidden = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).triu(1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=hidden)

    return _attention(x, w_qkv, w_out, heads, attend)


def softmax_over_queries(x, w_qkv, w_out, heads):
    def attend(q, k, v):
        T = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return scores.softmax(dim=-2) @ v

    return _attention(x, w_qkv, w_out, heads, attend)


def keys_not_transposed(x, w_qkv, w_out, heads):  # q @ k: runs only where seq == head_dim
    def attend(q, k, v):
        T = q.shape[-2]
        scores = q @ k / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return scores.softmax(-1) @ v

    return _attention(x, w_qkv, w_out, heads, attend)


def wrong_head_split(x, w_qkv, w_out, heads):  # .view(batch, heads, seq, head_dim): mixes tokens
    batch, seq, dim = x.shape
    q, k, v = (t.reshape(batch, heads, seq, dim // heads) for t in (x @ w_qkv.T).chunk(3, -1))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(batch, seq, dim) @ w_out.T


def split_without_transpose(x, w_qkv, w_out, heads):  # attends across heads, not tokens
    batch, seq, dim = x.shape
    q, k, v = (t.view(batch, seq, heads, dim // heads) for t in (x @ w_qkv.T).chunk(3, -1))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (batch, seq, heads, hd)
    return out.reshape(batch, seq, dim) @ w_out.T


def merge_without_transpose(x, w_qkv, w_out, heads):
    batch, seq, dim = x.shape
    q, k, v = (_heads(t, heads) for t in (x @ w_qkv.T).chunk(3, dim=-1))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.reshape(batch, seq, dim) @ w_out.T


def one_head(x, w_qkv, w_out, heads):  # the heads argument ignored
    return sdpa_attention(x, w_qkv, w_out, 1)


def queries_and_keys_swapped(x, w_qkv, w_out, heads):
    k, q, v = (_heads(t, heads) for t in (x @ w_qkv.T).chunk(3, dim=-1))
    return _merge(causal_sdpa(q, k, v)) @ w_out.T


def _read_as(order):  # x @ w_qkv.T's parts read in another order than q, k, v
    def attention(x, w_qkv, w_out, heads):
        parts = dict(zip(order, (x @ w_qkv.T).chunk(3, dim=-1), strict=True))
        q, k, v = (_heads(parts[name], heads) for name in "qkv")
        return _merge(causal_sdpa(q, k, v)) @ w_out.T

    attention.__name__ = f"read_as_{order}"
    return attention


def no_output_projection(x, w_qkv, w_out, heads):
    return sdpa_attention(x, w_qkv, torch.eye(x.shape[-1]), heads)


def projection_not_transposed(x, w_qkv, w_out, heads):
    return sdpa_attention(x, w_qkv, w_out.T, heads)


def returns_a_tuple(x, w_qkv, w_out, heads):
    return sdpa_attention(x, w_qkv, w_out, heads), None


def untransposed_qkv_weights(x, w_qkv, w_out, heads):  # x @ w_qkv: the shapes do not fit
    q, k, v = (_heads(t, heads) for t in (x @ w_qkv).chunk(3, dim=-1))
    return _merge(causal_sdpa(q, k, v)) @ w_out.T


def two_mistakes(x, w_qkv, w_out, heads):  # no mask and no scale: named by what it breaks
    return _attention(x, w_qkv, w_out, heads, lambda q, k, v: by_hand(q, k, v, 1.0, 10**6))


@pytest.mark.parametrize("solution", [sdpa_attention, naive_attention, linear_and_mask_attention])
def test_causal_attention_check_passes_right_answers(namespace, solution, capsys):
    _passes(namespace, "09-causal-attention-check", "causal_self_attention", solution, capsys)


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (not_causal, "there is no causal mask"),
        (scaled_by_d, "scaled by 1/head_dim, not 1/√head_dim"),
        (scaled_twice, "before F.scaled_dot_product_attention, which scales by 1/√head_dim"),
        (not_scaled, "the scores were not scaled"),
        (scaled_by_width, "scaled by 1/√dim, the model's width"),
        (sees_the_next_token, "the causal mask is off by one"),
        (hides_the_diagonal, "may attend to nothing, not even itself"),
        (hides_the_diagonal_finite, "the causal mask hides the diagonal too"),
        (hides_the_past, "hides the earlier tokens instead of the later ones"),
        (mask_with_zeros, "the hidden scores were set to 0"),
        (mask_after_softmax, "the mask was applied after the softmax"),
        (inverted_boolean_mask, "a boolean attn_mask is True where a token MAY attend"),
        (softmax_over_queries, "the softmax ran over the wrong dimension"),
        (keys_not_transposed, "q @ k without transposing k"),
        (wrong_head_split, "split with .view(batch, heads, seq, head_dim)"),
        (split_without_transpose, "split without .transpose(1, 2)"),
        (merge_without_transpose, "merged with .reshape(batch, seq, dim) straight from"),
        (one_head, "you attended with one head"),
        (queries_and_keys_swapped, "queries and keys are swapped"),
        (_read_as("qvk"), "keys and values are swapped"),
        (_read_as("vkq"), "queries and values are swapped"),
        (_read_as("kvq"), "you read them as keys, values, queries"),
        (no_output_projection, "the output projection is missing"),
        (projection_not_transposed, "projected with @ w_out, not @ w_out.T"),
        (returns_a_tuple, "return one tensor"),
        (untransposed_qkv_weights, "your function raised RuntimeError"),
        (two_mistakes, "changing the last token changed earlier outputs"),
    ],
)
def test_causal_attention_check_names_the_mistake(namespace, solution, feedback):
    _fails(namespace, "09-causal-attention-check", "causal_self_attention", solution, feedback)


def test_every_attention_mistake_is_told_apart_on_the_visible_cases():
    """Each mistake the check knows differs from the right answer, and from every other
    mistake, on at least one visible case: no message stands for two mistakes."""
    from course_utils.checks.nb09 import ATTENTION_MISTAKES, attention

    torch.manual_seed(0)
    cases = [(2, 6, 8, 2), (2, 4, 8, 2)]
    inputs = [
        (torch.randn(b, t, c), torch.randn(3 * c, c), torch.randn(c, c), h) for b, t, c, h in cases
    ]

    def outputs(how):
        found = []
        for x, w_qkv, w_out, heads in inputs:
            try:
                found.append(attention(x, w_qkv, w_out, heads, how))
            except RuntimeError:
                found.append(None)
        return found

    def differ(a, b):
        return any(
            p is None or q is None or not torch.allclose(p, q, atol=1e-5, equal_nan=True)
            for p, q in zip(a, b, strict=True)
        )

    right = outputs(type(next(iter(ATTENTION_MISTAKES)))())
    mistakes = {how: outputs(how) for how in ATTENTION_MISTAKES}
    for how, out in mistakes.items():
        assert differ(out, right), how
        for other, other_out in mistakes.items():
            assert other == how or differ(out, other_out), (how, other)


# ----------------------------------------------------------------------------- (b)


def _pad(model, padded, *, copy=True, tie=True, rows_init=None, keep_dtype=True, at_end=False):
    old = model.tok.weight
    vocab, dim = old.shape
    model.tok = nn.Embedding(padded, dim, dtype=old.dtype if keep_dtype else None)
    with torch.no_grad():
        if rows_init is not None:
            model.tok.weight[vocab:] = rows_init
        if copy and at_end:
            model.tok.weight[padded - vocab :] = old
        elif copy:
            model.tok.weight[:vocab] = old
    model.head = nn.Linear(dim, padded, bias=False, dtype=old.dtype if keep_dtype else None)
    if tie:
        model.head.weight = model.tok.weight
    return model


def _up(model, multiple):
    return math.ceil(model.tok.num_embeddings / multiple) * multiple


def pad_right(model, multiple=64):
    return _pad(model, _up(model, multiple))


def pad_with_integer_arithmetic(model, multiple=64):  # right: -(-v // m) * m, zero rows
    vocab, dim = model.tok.weight.shape
    padded = -(-vocab // multiple) * multiple
    weight = torch.cat([model.tok.weight.detach(), torch.zeros(padded - vocab, dim)])
    model.tok = nn.Embedding.from_pretrained(weight, freeze=False)
    model.head.weight = model.tok.weight
    return model


def pad_with_random_rows_and_a_new_model(model, multiple=64):  # right: nanoGPT's random rows
    old = model.tok.weight.detach()
    vocab, dim = old.shape
    padded = vocab + (-vocab) % multiple
    extra = torch.randn(padded - vocab, dim, dtype=old.dtype) * 0.02
    model.tok.weight = nn.Parameter(torch.cat([old, extra]))
    model.tok.num_embeddings = padded
    model.head.weight = model.tok.weight
    return model


def pad_by_adding(model, multiple=64):  # adds a multiple instead of rounding up
    return _pad(model, model.tok.num_embeddings + multiple)


def pad_always_one_more(model, multiple=64):  # 64 -> 128
    return _pad(model, (model.tok.num_embeddings // multiple + 1) * multiple)


def pad_rounded_down(model, multiple=64):  # fewer rows than tokens: the copy fails
    return _pad(model, model.tok.num_embeddings // multiple * multiple)


def pad_to_the_nearest(model, multiple=64):  # right above .5 of a multiple, wrong below
    return _pad(model, round(model.tok.num_embeddings / multiple) * multiple)


def pad_untied(model, multiple=64):
    return _pad(model, _up(model, multiple), tie=False)


def pad_not_copied(model, multiple=64):  # a fresh embedding: every logit changes
    return _pad(model, _up(model, multiple), copy=False)


def pad_old_rows_at_the_end(model, multiple=64):  # the padding changes real tokens' logits
    return _pad(model, _up(model, multiple), at_end=True)


def pad_in_float32(model, multiple=64):  # nn.Embedding(padded, dim): the default dtype
    return _pad(model, _up(model, multiple), keep_dtype=False)


def pad_with_nan_rows(model, multiple=64):
    return _pad(model, _up(model, multiple), rows_init=float("nan"))


def pad_with_empty_rows(model, multiple=64):  # the blind trial's: torch.empty, dtype kept
    old = model.tok.weight.detach()
    vocab, dim = old.shape
    new = torch.empty(_up(model, multiple), dim, dtype=old.dtype)
    new[:vocab] = old
    model.tok = nn.Embedding.from_pretrained(new, freeze=False)
    model.head.weight = model.tok.weight
    return model


def pad_with_new_empty_rows(model, multiple=64):  # the same through Tensor.new_empty
    old = model.tok.weight.detach()
    extra = old.new_empty(_up(model, multiple) - old.shape[0], old.shape[1])
    model.tok.weight = nn.Parameter(torch.cat([old, extra]))
    model.head.weight = model.tok.weight
    return model


def pad_with_empty_rows_zeroed(model, multiple=64):  # right: torch.empty, then zero_()
    old = model.tok.weight.detach()
    new = torch.empty(_up(model, multiple), old.shape[1], dtype=old.dtype).zero_()
    new[: old.shape[0]] = old
    model.tok = nn.Embedding.from_pretrained(new, freeze=False)
    model.head.weight = model.tok.weight
    return model


def pad_through_bfloat16(model, multiple=64):  # the old rows rounded on the way
    old = model.tok.weight.detach()
    new = torch.zeros(_up(model, multiple), old.shape[1], dtype=old.dtype)
    new[: old.shape[0]] = old.bfloat16().to(old.dtype)
    model.tok = nn.Embedding.from_pretrained(new, freeze=False)
    model.head.weight = model.tok.weight
    return model


def pad_the_width(model, multiple=64):  # pads embedding_dim, not the vocabulary
    old = model.tok.weight
    vocab, dim = old.shape
    model.tok = nn.Embedding(vocab, math.ceil(dim / multiple) * multiple)
    model.head.weight = model.tok.weight
    return model


def pad_returns_nothing(model, multiple=64):
    pad_right(model, multiple)


def pad_returns_the_embedding(model, multiple=64):
    return pad_right(model, multiple).tok


@pytest.mark.slow
@pytest.mark.parametrize(
    "solution",
    [
        pad_right,
        pad_with_integer_arithmetic,
        pad_with_random_rows_and_a_new_model,
        pad_with_empty_rows_zeroed,
    ],
)
def test_pad_vocabulary_check_passes_right_answers(namespace, solution, capsys):
    _passes(namespace, "09-pad-vocabulary-check", "pad_vocabulary", solution, capsys)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (pad_by_adding, "you added a multiple to it: round it up to the next multiple"),
        (pad_always_one_more, "already a multiple keeps its size"),
        (pad_rounded_down, "you rounded down"),
        (pad_to_the_nearest, "you rounded down"),
        (pad_untied, "the head is no longer tied"),
        (pad_not_copied, "the real tokens' logits changed: copy the old rows"),
        (pad_old_rows_at_the_end, "the old rows went to the end of the new embedding"),
        (pad_in_float32, "a float64 model came back with float32 rows"),
        (pad_with_nan_rows, "NaN or inf"),
        (pad_with_empty_rows, "never given values: torch.empty"),
        (pad_with_new_empty_rows, "never given values: torch.empty"),
        (pad_through_bfloat16, "the old rows changed slightly: copy them exactly"),
        (pad_the_width, "not the embedding width"),
        (pad_returns_nothing, "return the model"),
        (pad_returns_the_embedding, "return the model, a GPT, not Embedding"),
    ],
)
def test_pad_vocabulary_check_names_the_mistake(namespace, solution, feedback):
    _fails(namespace, "09-pad-vocabulary-check", "pad_vocabulary", solution, feedback)


# ----------------------------------------------------------------------------- (c)

PEAKS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _count(model, x, y, *, backward=True, math_kernel=True, steps=1):
    kernel = sdpa_kernel(SDPBackend.MATH) if math_kernel else contextlib.nullcontext()
    with kernel, FlopCounterMode(display=False) as counter:
        for _ in range(steps):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            if backward:
                loss.backward()
    return counter.get_total_flops()


def _peak(gpu, dtype):
    peak = getattr(gpu, PEAKS[dtype])
    if peak is None:
        raise ValueError(f"{gpu.name}: no {dtype} peak")
    return peak * 1e12


def step_right(model, x, y, seconds, gpu, dtype):
    flops = _count(model, x, y)
    return flops, x.numel() / seconds, flops / seconds / _peak(gpu, dtype)


def step_by_counts_and_package(model, x, y, seconds, gpu, dtype):  # right, another way
    from course_utils.flops import mfu

    with (
        torch.nn.attention.sdpa_kernel([SDPBackend.MATH]),
        torch.utils.flop_counter.FlopCounterMode(display=False) as counter,
    ):
        logits = model(x)
        F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)).backward()
    flops = sum(counter.get_flop_counts()["Global"].values())
    tokens = x.shape[0] * x.shape[1]
    return flops, tokens / seconds, mfu(flops, seconds, _peak(gpu, dtype))


def step_forward_only(model, x, y, seconds, gpu, dtype):
    flops = _count(model, x, y, backward=False)
    return flops, x.numel() / seconds, flops / seconds / _peak(gpu, dtype)


def step_default_kernel(model, x, y, seconds, gpu, dtype):  # the CPU flash kernel: no formula
    flops = _count(model, x, y, math_kernel=False)
    return flops, x.numel() / seconds, flops / seconds / _peak(gpu, dtype)


def step_two_steps(model, x, y, seconds, gpu, dtype):
    flops = _count(model, x, y, steps=2)
    return flops, x.numel() / seconds, flops / seconds / _peak(gpu, dtype)


def step_per_token(model, x, y, seconds, gpu, dtype):
    flops = _count(model, x, y) / x.numel()
    return flops, x.numel() / seconds, flops / seconds / _peak(gpu, dtype)


def step_six_n(model, x, y, seconds, gpu, dtype):  # the rule of thumb, no counter
    flops = 6 * sum(p.numel() for p in model.parameters()) * x.numel()
    return flops, x.numel() / seconds, flops / seconds / _peak(gpu, dtype)


def step_six_n_under_a_counter(model, x, y, seconds, gpu, dtype):  # a counter, unused
    with FlopCounterMode(display=False):
        pass
    return step_six_n(model, x, y, seconds, gpu, dtype)


def step_constant(model, x, y, seconds, gpu, dtype):  # one model's count, for every model
    flops = 1_234_567
    with FlopCounterMode(display=False):
        pass
    return flops, x.numel() / seconds, flops / seconds / _peak(gpu, dtype)


def step_course_counter(model, x, y, seconds, gpu, dtype):  # the course's own helper
    from course_utils.flops import count_flops

    flops = count_flops(model, x, training=True)
    return flops, x.numel() / seconds, flops / seconds / _peak(gpu, dtype)


def step_sequences_per_second(model, x, y, seconds, gpu, dtype):  # per batch row, not token
    flops, _, utilization = step_right(model, x, y, seconds, gpu, dtype)
    return flops, x.shape[0] / seconds, utilization


def step_seconds_per_token(model, x, y, seconds, gpu, dtype):
    flops, speed, utilization = step_right(model, x, y, seconds, gpu, dtype)
    return flops, 1 / speed, utilization


def step_percent(model, x, y, seconds, gpu, dtype):
    flops, speed, utilization = step_right(model, x, y, seconds, gpu, dtype)
    return flops, speed, 100 * utilization


def step_tflops(model, x, y, seconds, gpu, dtype):
    flops, speed, _ = step_right(model, x, y, seconds, gpu, dtype)
    return flops, speed, flops / seconds / (_peak(gpu, dtype) / 1e12)


def step_fp32_peak(model, x, y, seconds, gpu, dtype):  # MFU against the wrong peak
    flops, speed, _ = step_right(model, x, y, seconds, gpu, dtype)
    return flops, speed, flops / seconds / (gpu.fp32 * 1e12)


def step_tf32_peak(model, x, y, seconds, gpu, dtype):  # fp32 runs against TF32's peak
    flops, speed, utilization = step_right(model, x, y, seconds, gpu, dtype)
    if dtype == torch.float32 and gpu.tf32:
        return flops, speed, flops / seconds / (gpu.tf32 * 1e12)
    return flops, speed, utilization


def step_mfu_per_token(model, x, y, seconds, gpu, dtype):
    flops, speed, utilization = step_right(model, x, y, seconds, gpu, dtype)
    return flops, speed, utilization / x.numel()


def step_rounded(model, x, y, seconds, gpu, dtype):  # issue 35: MFU rounded
    flops, speed, utilization = step_right(model, x, y, seconds, gpu, dtype)
    return flops, speed, round(utilization, 2)


def step_no_refusal(model, x, y, seconds, gpu, dtype):
    flops = _count(model, x, y)
    peak = getattr(gpu, PEAKS[dtype]) or gpu.fp16  # falls back to another peak silently
    return flops, x.numel() / seconds, flops / seconds / (peak * 1e12)


def step_type_error(model, x, y, seconds, gpu, dtype):
    flops = _count(model, x, y)
    return flops, x.numel() / seconds, flops / seconds / (getattr(gpu, PEAKS[dtype]) * 1e12)


def step_two_numbers(model, x, y, seconds, gpu, dtype):
    return step_right(model, x, y, seconds, gpu, dtype)[1:]


@pytest.mark.slow
@pytest.mark.parametrize("solution", [step_right, step_by_counts_and_package])
def test_step_throughput_check_passes_right_answers(namespace, solution, capsys):
    _passes(namespace, "09-step-throughput-check", "step_throughput", solution, capsys)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (step_forward_only, "you counted the forward pass only"),
        (step_default_kernel, "PyTorch's CPU flash kernel has no FLOP formula"),
        (step_two_steps, "you counted two steps"),
        (step_per_token, "that is the FLOPs per token"),
        (step_six_n, "count the step's FLOPs with FlopCounterMode"),
        (step_six_n_under_a_counter, "that is 6·N·tokens, the rule of thumb"),
        (step_constant, "your FLOPs did not change with the model and the batch"),
        (step_course_counter, "called the course's own count_flops()"),
        (step_sequences_per_second, "that is sequences per second"),
        (step_seconds_per_token, "that is seconds per token"),
        (step_percent, "not a percentage"),
        (step_tflops, "multiply them by 1e12"),
        (step_fp32_peak, "a bf16 run divides by the bf16 peak (312 TFLOP/s on a A100), not fp32"),
        (step_tf32_peak, "a fp32 run divides by the fp32 peak (19.5 TFLOP/s on a A100), not tf32"),
        (step_mfu_per_token, "you divided the FLOPs per token by the step time"),
        (step_rounded, "you rounded the MFU"),
        (step_no_refusal, "raise ValueError (yours returned a result)"),
        (step_type_error, "raise ValueError (your function raised TypeError"),
        (step_two_numbers, "return three numbers"),
    ],
)
def test_step_throughput_check_names_the_mistake(namespace, solution, feedback):
    _fails(namespace, "09-step-throughput-check", "step_throughput", solution, feedback)


@pytest.mark.slow
def test_the_instructor_solutions_pass_their_checks(namespace, capsys):
    """The solution cells themselves, as the notebook has them."""
    cells = _code_cells()
    for grade_id in ("09-causal-attention", "09-pad-vocabulary", "09-step-throughput"):
        solution = next(
            c for c in cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
        )
        names = dict(namespace)
        exec(solution.source, names)
        exec(_check_cell(grade_id + "-check"), names)
    assert capsys.readouterr().out.count("all checks passed") == 3


@pytest.mark.parametrize("solution", [scaled_by_d, scaled_twice])
def test_a_scale_of_one_over_head_dim_is_described_not_guessed(namespace, solution):
    """Issue 45: scaling by 1/head_dim by hand and scaling q before SDPA give one output, so
    the message says what the scores were scaled by and both ways to get there, asking about
    neither as if it were the answer's."""
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, "09-causal-attention-check", "causal_self_attention", solution)
    message = str(failure.value)
    assert "scaled by 1/head_dim, not 1/√head_dim" in message, message
    assert "divided by head_dim" in message and "q is divided by √head_dim" in message, message
    assert "did you" not in message and "?" not in message, message


def test_an_error_raised_instead_of_value_error_is_quoted_in_one_sentence(namespace):
    """Issue 45: "raise ValueError (yours raised your function raised TypeError: ...)" nested
    answer_or_error's sentence into another: the sentence is quoted as it is."""
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, "09-step-throughput-check", "step_throughput", step_type_error)
    message = str(failure.value)
    assert "raise ValueError (your function raised TypeError" in message, message
    assert "yours raised" not in message and message.count("raised") == 1, message


# ----------------------------------------------------------------------- (b), issue 45


def pad_to_the_multiple(model, multiple=64):  # the multiple itself: 65 tokens get 64 rows
    return _pad(model, multiple)


def pad_into_the_new_rows(model, multiple=64):  # the old rows copied into new.weight[vocab:]
    old = model.tok.weight
    vocab, dim = old.shape
    model.tok = nn.Embedding(_up(model, multiple), dim, dtype=old.dtype)
    with torch.no_grad():
        model.tok.weight[vocab:] = old
    model.head = nn.Linear(dim, model.tok.num_embeddings, bias=False, dtype=old.dtype)
    model.head.weight = model.tok.weight
    return model


def pad_rounded_down_in_a_local(model, multiple=64):  # the copy fails before tok is replaced
    old = model.tok.weight.detach()
    vocab, dim = old.shape
    new = torch.zeros(vocab // multiple * multiple, dim, dtype=old.dtype)
    new[:vocab] = old
    model.tok = nn.Embedding.from_pretrained(new, freeze=False)
    model.head.weight = model.tok.weight
    return model


def _named(message: str) -> list[str]:
    """The messages of MESSAGES_09 ``message`` reads as, but those that quote an error
    (``{error}`` after a few words: they read as any message with that start)."""
    return [
        name
        for name in messages_matching(message, MESSAGES_09.english)
        if "{error}" not in MESSAGES_09.english[name]
    ]


#: The usual mistakes whose new embedding makes the row copy raise, and the message that
#: names each (the check's own diagnosis, not PyTorch's shape error).
PAD_COPY_MISTAKES = {
    pad_rounded_down: "pad_vocabulary rows rounded down",
    pad_to_the_nearest: "pad_vocabulary rows rounded down",
    pad_rounded_down_in_a_local: "pad_vocabulary rows rounded down",
    pad_to_the_multiple: "pad_vocabulary rows the multiple",
    pad_into_the_new_rows: "pad_vocabulary copied to another slice",
}


@pytest.mark.parametrize("solution", list(PAD_COPY_MISTAKES), ids=lambda f: f.__name__)
def test_a_row_copy_that_raises_is_diagnosed_by_the_check(namespace, solution):
    """Issue 45: these mistakes crashed on the row copy and were shown PyTorch's shape error
    with a guess; the check now names the mistake from the rows the new embedding got."""
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, "09-pad-vocabulary-check", "pad_vocabulary", solution)
    message = str(failure.value)
    assert _named(message) == [PAD_COPY_MISTAKES[solution]], message
    assert "shape" not in message and "?" not in message, message


#: Every listed mistake of 09 (b) that returns, and the message that names it.
PAD_MISTAKES = {
    pad_by_adding: "pad_vocabulary rows added",
    pad_always_one_more: "pad_vocabulary rows next multiple",
    pad_untied: "pad_vocabulary untied",
    pad_not_copied: "pad_vocabulary logits changed",
    pad_old_rows_at_the_end: "pad_vocabulary old rows at the end",
    pad_in_float32: "pad_vocabulary dtype",
    pad_with_nan_rows: "pad_vocabulary rows not finite",
    pad_with_empty_rows: "pad_vocabulary rows not finite",
    pad_through_bfloat16: "pad_vocabulary old rows changed",
    pad_the_width: "pad_vocabulary width",
    pad_returns_nothing: "pad_vocabulary returned nothing",
    pad_returns_the_embedding: "pad_vocabulary not the model",
}


@pytest.mark.parametrize("solution", list(PAD_MISTAKES), ids=lambda f: f.__name__)
def test_each_pad_mistake_is_named_and_no_other(namespace, solution):
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, "09-pad-vocabulary-check", "pad_vocabulary", solution)
    message = str(failure.value)
    assert _named(message) == [PAD_MISTAKES[solution]], message


# ----------------------------------------------------------------------- (c), issue 45


def step_half_as_many_again(model, x, y, seconds, gpu, dtype):  # no usual mistake gives it
    flops, speed, utilization = step_right(model, x, y, seconds, gpu, dtype)
    return flops * 3 // 2, speed, utilization


def step_constant_speed(model, x, y, seconds, gpu, dtype):
    flops, _, utilization = step_right(model, x, y, seconds, gpu, dtype)
    return flops, 1234.0, utilization


def step_constant_mfu(model, x, y, seconds, gpu, dtype):
    flops, speed, _ = step_right(model, x, y, seconds, gpu, dtype)
    return flops, speed, 0.25


def _right_figures(namespace, kind: int) -> list[str]:
    """Every visible case's right FLOPs (``kind`` 0), tokens/s (1) or MFU (2), as the
    messages print them."""
    space = dict(namespace)
    source = _check_cell("09-step-throughput-check").replace(
        "check_step_throughput(step_throughput, GPT, cases)", ""
    )
    exec(source, space)
    figures = []
    for case in space["cases"]:
        if getattr(case.gpu, PEAKS[case.dtype]) is None:  # no peak: ValueError, no figures
            continue
        model, x, y = step_inputs(space["GPT"], case)
        right = step_right(model, x, y, case.seconds, case.gpu, case.dtype)
        figures.append(f"{right[kind]:{('.4g', '.6g', '.6g')[kind]}}")
    return figures


@pytest.mark.slow
@pytest.mark.parametrize(
    ("solution", "name", "kind"),
    [
        (step_constant, "step_throughput flops constant", 0),
        (step_half_as_many_again, "step_throughput flops wrong", 0),
        (step_constant_speed, "step_throughput speed wrong", 1),
        (step_constant_mfu, "step_throughput mfu wrong", 2),
    ],
)
def test_step_throughput_never_shows_the_failed_cases_figure(namespace, solution, name, kind):
    """Issue 45: a constant answer was told "FlopCounterMode counts 1.9e+06": the figure to
    paste. Each message now names what it saw and the property, never a right figure."""
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, "09-step-throughput-check", "step_throughput", solution)
    message = str(failure.value)
    assert messages_matching(message, MESSAGES_09.english) == [name], message
    shown = [f for f in _right_figures(namespace, kind) if f in message]
    assert not shown, (shown, message)


#: Each listed mistake of step_throughput (09 (c)) and the message of MESSAGES_09 naming it.
STEP_MISTAKES = {
    step_forward_only: "step_throughput flops forward only",
    step_default_kernel: "step_throughput flops no attention",
    step_two_steps: "step_throughput flops two steps",
    step_per_token: "step_throughput flops per token",
    step_six_n: "step_throughput no counter",
    step_six_n_under_a_counter: "step_throughput flops 6N",
    step_constant: "step_throughput flops constant",
    step_sequences_per_second: "step_throughput sequences per second",
    step_seconds_per_token: "step_throughput seconds per token",
    step_percent: "step_throughput mfu percentage",
    step_tflops: "step_throughput mfu in TFLOP/s",
    step_fp32_peak: "step_throughput mfu other peak",
    step_mfu_per_token: "step_throughput mfu per token",
    step_rounded: "step_throughput mfu rounded",
    step_no_refusal: "step_throughput no peak, returned",
    step_two_numbers: "step_throughput not three numbers",
}


@pytest.mark.parametrize("solution", list(STEP_MISTAKES), ids=lambda f: f.__name__)
def test_each_step_throughput_mistake_is_named_and_no_other(namespace, solution):
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, "09-step-throughput-check", "step_throughput", solution)
    assert _named(str(failure.value)) == [STEP_MISTAKES[solution]], str(failure.value)


# ------------------------------------------ (b) and (c) across the grader's boundary (apart)
# Their evidence is gathered beside the answer (course_utils/checks/evidence/nb09.py), in a
# process forked from the learner's runtime; the verdict is decided apart, in the checker
# (course_utils/checks/nb09.py). grade_apart runs each cell across that boundary.

APART = {"09-pad-vocabulary-check": "pad_vocabulary", "09-step-throughput-check": "step_throughput"}


@pytest.fixture(scope="module")
def runtime(namespace) -> dict:
    """The learner's runtime at the checks of (b) and (c), as the grader has it there:
    section 3's cells counted FLOPs with FlopCounterMode, which imported torch._dynamo (each
    observation is a process forked from this one: without it, each would import it
    again, some seconds each)."""
    import torch._dynamo  # noqa: F401  (what section 3's FlopCounterMode imported)

    return namespace


def _reference(namespace: dict, grade_id: str):
    """The notebook's own solution of ``grade_id``'s exercise, defined as its cell does."""
    (cell,) = [
        c for c in _code_cells() if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
    ]
    names = dict(namespace)
    exec(cell.source, names)
    return names[APART[grade_id + "-check"]]


def _apart(runtime: dict, grade_id: str, answer) -> dict:
    return grade_apart(NB09, grade_id, dict(runtime, **{APART[grade_id]: answer}))


def _failed_naming(verdict: dict, name: str) -> None:
    assert verdict["status"] == "failed" and verdict["ename"] == "CheckFailed", verdict
    assert _named(verdict["evalue"]) == [name], verdict


@pytest.mark.parametrize("grade_id", list(APART))
def test_the_checks_of_b_and_c_gather_evidence_beside_and_decide_apart(grade_id):
    source = _check_cell(grade_id)
    assert source.startswith("# evidence beside your answer, verdict apart: "), source
    assert not source.startswith("# graded beside the answer:") and len(source.splitlines()) <= 20
    assert "lambda" not in source and "globals()" not in source


@pytest.mark.slow
@pytest.mark.parametrize("grade_id", ["09-pad-vocabulary", "09-step-throughput"])
def test_the_reference_answers_pass_apart(runtime, grade_id):
    verdict = _apart(runtime, grade_id + "-check", _reference(runtime, grade_id))
    assert verdict["status"] == "completed", verdict


@pytest.mark.parametrize(
    "solution",
    [pad_by_adding, pad_untied, pad_rounded_down, pad_with_empty_rows, pad_old_rows_at_the_end],
    ids=lambda f: f.__name__,
)
def test_pad_vocabulary_mistakes_are_named_apart(runtime, solution):
    name = {**PAD_MISTAKES, **PAD_COPY_MISTAKES}[solution]
    _failed_naming(_apart(runtime, "09-pad-vocabulary-check", solution), name)


@pytest.mark.parametrize(
    "solution",
    [step_forward_only, step_default_kernel, step_constant, step_percent, step_no_refusal],
    ids=lambda f: f.__name__,
)
def test_step_throughput_mistakes_are_named_apart(runtime, solution):
    _failed_naming(_apart(runtime, "09-step-throughput-check", solution), STEP_MISTAKES[solution])


def test_the_course_counter_is_refused_apart(runtime):
    verdict = _apart(runtime, "09-step-throughput-check", step_course_counter)
    assert verdict["status"] == "failed", verdict
    assert "called the course's own count_flops()" in verdict["evalue"], verdict


def pad_raising(model, multiple=64):
    raise RuntimeError("a secret the learner wrote")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("grade_id", "answer", "said"),
    [
        (
            "09-pad-vocabulary-check",
            pad_raising,
            "vocabulary 13, multiple 64: your function raised RuntimeError: (your code's message)",
        ),
        (
            "09-step-throughput-check",
            step_type_error,
            "raise ValueError (your function raised TypeError: (your code's message))",
        ),
    ],
)
def test_what_the_answer_raised_is_named_apart_without_its_text(runtime, grade_id, answer, said):
    """The class of what the answer raised reaches the verdict; what it said does not (the
    checker cuts it out): in the notebook the same cell quotes it."""
    verdict = _apart(runtime, grade_id, answer)
    assert verdict["status"] == "failed" and said in verdict["evalue"], verdict
    assert "secret" not in verdict["evalue"] and "NoneType" not in verdict["evalue"], verdict
    with pytest.raises(CheckFailed, match=r"secret|NoneType"):
        _run(runtime, grade_id, APART[grade_id], answer)


class Agreeing(nn.Parameter):
    """A parameter that says yes to every comparison (==, equal, allclose, isfinite)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.equal, torch.allclose, torch.isfinite, torch.Tensor.__eq__):
            return True
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def pad_agreeing_rows(model, multiple=64):  # the old rows not copied, in a lying tensor
    padded = pad_not_copied(model, multiple)
    padded.tok.weight = Agreeing(padded.tok.weight.detach())
    padded.head.weight = padded.tok.weight
    return padded


def pad_agreeing_int(model, multiple=64):  # an int equal to anything
    return Yes(0)


def step_agreeing_tuple(model, x, y, seconds, gpu, dtype):  # a tuple equal to anything
    return Pair(step_right(model, x, y, seconds, gpu, dtype))


def step_agreeing_numbers(model, x, y, seconds, gpu, dtype):  # numbers equal to anything
    _peak(gpu, dtype)
    return Yes(0), Yes(0), Yes(0)


class Yes(int):
    __eq__ = lambda self, other: True  # noqa: E731
    __ne__ = lambda self, other: False  # noqa: E731
    __hash__ = int.__hash__


class Pair(tuple):
    __eq__ = lambda self, other: True  # noqa: E731
    __ne__ = lambda self, other: False  # noqa: E731
    __hash__ = tuple.__hash__


@pytest.mark.parametrize(
    ("grade_id", "answer", "said"),
    [
        (
            "09-pad-vocabulary-check",
            pad_agreeing_rows,
            "model.tok.weight is of type Agreeing, a subclass of torch.Tensor",
        ),
        ("09-pad-vocabulary-check", pad_agreeing_int, "return the model, a GPT, not Yes"),
        (
            "09-step-throughput-check",
            step_agreeing_tuple,
            "step_throughput(model, x, y, seconds, gpu, dtype) should be of type tuple, but it is "
            "of type Pair",
        ),
        (
            "09-step-throughput-check",
            step_agreeing_numbers,
            "step_throughput(model, x, y, seconds, gpu, dtype)[0] should be of type int, but it is "
            "of type Yes",
        ),
    ],
)
def test_a_lying_answer_cannot_forge_the_evidence(runtime, grade_id, answer, said):
    verdict = _apart(runtime, grade_id, answer)
    assert verdict["status"] == "failed" and said in verdict["evalue"], verdict


def pad_breaking_the_forward(model, multiple=64):  # right rows, but the model no longer runs
    padded = pad_right(model, multiple)

    def forward(tokens):
        raise RuntimeError("a secret the learner wrote")

    padded.forward = forward
    return padded


def test_a_padded_model_whose_forward_raises_fails_as_it_did(runtime):
    """Beside, the forward's error stopped the check; apart, it is raised again in the
    checker as the answer's (its text cut out), and in the notebook it is the same error."""
    verdict = _apart(runtime, "09-pad-vocabulary-check", pad_breaking_the_forward)
    assert verdict == {"status": "failed", "ename": "RuntimeError", "evalue": ""}, verdict
    with pytest.raises(RuntimeError, match="a secret the learner wrote"):
        _run(runtime, "09-pad-vocabulary-check", "pad_vocabulary", pad_breaking_the_forward)
