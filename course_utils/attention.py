"""Causal self-attention written out (:func:`attention`, the :class:`Attention` module):
the reference notebooks 04 and 09 teach with, and the one notebook 09's check compares a
learner's answer with (:mod:`course_utils.checks.nb09`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Attention:
    """How to compute multi-head causal self-attention: the right way by default; each
    other value is one usual mistake (see :data:`ATTENTION_MISTAKES`)."""

    # the scale: "head_dim" (1/√head_dim), "head_dim twice" (1/head_dim), "dim", "none"
    scale: str = "head_dim"
    mask: str = "causal"  # "causal", "none", "sees next", "hides self", "hides past", "zero",
    # "after softmax", "inverted" (only the later keys: a boolean attn_mask read backwards)
    softmax_dim: int = -1
    split: str = "right"  # "right", "heads first" (a view that mixes tokens), "no transpose"
    merge: str = "right"  # "right", "no transpose"
    order: str = "qkv"  # the order x @ w_qkv.T is read in: "qkv", or another, e.g. "kqv"
    keys: str = "transposed"  # "transposed", "not transposed" (q @ k)
    heads: str = "heads"  # "heads", "one" (the heads argument ignored)
    projection: str = "w_out.T"  # "w_out.T", "none", "w_out"


def attention(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    w_out: torch.Tensor,
    heads: int,
    how: Attention = Attention(),
) -> torch.Tensor:
    """Multi-head causal self-attention of ``x`` (batch, seq, dim) written out by hand,
    as ``how`` says (by default right).

    >>> x, w_qkv, w_out = torch.randn(2, 5, 8), torch.randn(24, 8), torch.randn(8, 8)
    >>> sdpa = F.scaled_dot_product_attention
    >>> def heads(t):
    ...     return t.view(2, 5, 2, 4).transpose(1, 2)
    >>> q, k, v = (heads(t) for t in (x @ w_qkv.T).split(8, -1))
    >>> out = sdpa(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 5, 8) @ w_out.T
    >>> torch.allclose(attention(x, w_qkv, w_out, 2), out, atol=1e-5)
    True
    """
    batch, seq, dim = x.shape
    n = 1 if how.heads == "one" else heads
    size = dim // n
    chunks = dict(zip(how.order, (x @ w_qkv.T).split(dim, dim=-1), strict=True))
    parts = [chunks[name] for name in "qkv"]  # read as how.order says

    def split(t: torch.Tensor) -> torch.Tensor:
        if how.split == "heads first":
            return t.reshape(batch, n, seq, size)
        t = t.reshape(batch, seq, n, size)
        return t if how.split == "no transpose" else t.transpose(1, 2)

    q, k, v = (split(t) for t in parts)
    keys = k if how.keys == "not transposed" else k.transpose(-2, -1)
    scale = {"head_dim": size**-0.5, "head_dim twice": 1 / size, "dim": dim**-0.5, "none": 1.0}
    scores = q @ keys * scale[how.scale]
    rows = scores.shape[-2]
    ones = torch.ones(rows, rows, dtype=torch.bool)
    above = ones.triu({"sees next": 2, "hides self": 0}.get(how.mask, 1))
    if how.mask == "hides past":
        above = ones.tril(-1)
    if how.mask in ("causal", "sees next", "hides past"):
        scores = scores.masked_fill(above, -math.inf)
    elif how.mask == "hides self":  # -inf would give the first row NaN: a large finite fill
        scores = scores.masked_fill(above, -1e9)
    elif how.mask == "zero":
        scores = scores.masked_fill(above, 0.0)
    elif how.mask == "inverted":
        scores = scores.masked_fill(~above, -math.inf)
    weights = scores.softmax(dim=how.softmax_dim)
    if how.mask == "inverted":  # SDPA gives a row with no key zeros, not NaN
        weights = weights.nan_to_num(0.0)
    if how.mask == "after softmax":
        weights = weights.masked_fill(above, 0.0)
    out = weights @ v
    if how.split == "no transpose":
        out = out.transpose(1, 2)  # back to (batch, heads, seq, head_dim), as a merge expects
    if how.merge == "no transpose":
        merged = out.reshape(batch, seq, dim)
    else:
        merged = out.transpose(1, 2).reshape(batch, seq, dim)
    if how.projection == "none":
        return merged
    return merged @ (w_out if how.projection == "w_out" else w_out.T)
