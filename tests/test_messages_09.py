"""Notebook 09's check messages are one table, MESSAGES_09: every name the checks look up
is in it (and every entry is looked up), its templates are plain strings, and a learner
reading the course in another language gets a wrong answer's feedback from the catalog."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from course_utils import language
from course_utils.checks import nb09 as checks_09
from course_utils.checks.nb09 import (
    ATTENTION_MISTAKES,
    MESSAGES_09,
    check_causal_attention,
    check_pad_vocabulary,
)
from course_utils.feedback import CheckFailed

#: The module that looks the table up: (a)'s check, and (b)'s and (c)'s deciding halves.
SOURCES = [Path(checks_09.__file__).read_text(encoding="utf-8")]
#: How each name of the table starts: the exercise whose check says it.
NAME = re.compile(r"^(causal_attention|pad_vocabulary|step_throughput) ")


def _table_and_names() -> tuple[ast.Dict, set[str]]:
    """The table's dict as written, and every other string of the modules shaped like a
    name of the table (a lookup, a mistake's name, a helper's answer)."""
    trees = [ast.parse(source) for source in SOURCES]
    (table,) = [
        node.args[1]
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Messages"
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "09"
    ]
    assert isinstance(table, ast.Dict)
    keys = {id(key) for key in table.keys}
    names = {
        node.value
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in keys
        and NAME.match(node.value)
    }
    return table, names


def test_every_name_the_checks_use_is_in_the_table_and_every_entry_is_used():
    _, names = _table_and_names()
    assert names - set(MESSAGES_09) == set(), "looked up but not in MESSAGES_09"
    assert set(MESSAGES_09) - names == set(), "in MESSAGES_09 but never looked up"
    assert set(ATTENTION_MISTAKES.values()) <= set(MESSAGES_09)
    assert len(set(ATTENTION_MISTAKES.values())) == len(ATTENTION_MISTAKES)
    # no lookup by a name built at run time (an f-string, a sum), which the above cannot see
    for node in (node for source in SOURCES for node in ast.walk(ast.parse(source))):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "MESSAGES_09":
            built = [n for n in ast.walk(node.slice) if isinstance(n, ast.JoinedStr | ast.BinOp)]
            assert not built, ast.unparse(node)


def test_the_templates_are_plain_strings_the_catalog_can_hold():
    table, _ = _table_and_names()
    for key, value in zip(table.keys, table.values, strict=True):
        assert isinstance(key, ast.Constant), ast.unparse(key)
        assert isinstance(value, ast.Constant), f"{key.value}: not a plain string (an f-string?)"
    for name, english in MESSAGES_09.english.items():
        assert english == english.strip() and "\n" not in english, name
        assert "{}" not in english, f"{name}: every field has a name"


def _catalog(folder: Path, translations: dict[str, str]) -> None:
    """A Bengali messages catalog in ``folder`` holding ``translations`` of MESSAGES_09."""
    entries = [
        f"msgctxt {json.dumps(MESSAGES_09.context(name), ensure_ascii=False)}\n"
        f"msgid {json.dumps(MESSAGES_09.english[name], ensure_ascii=False)}\n"
        f"msgstr {json.dumps(text, ensure_ascii=False)}\n"
        for name, text in translations.items()
    ]
    (folder / "bn").mkdir(parents=True)
    (folder / "bn" / language.MESSAGES_FILE).write_text("\n".join(entries), encoding="utf-8")


@pytest.fixture
def bengali(tmp_path, monkeypatch):
    _catalog(
        tmp_path,
        {
            "pad_vocabulary rows added": "{vocab} টোকেনের শব্দভান্ডার {multiple}-এর গুণিতকে "
            "প্যাড করলে {expected}টি সারি হয়, {rows}টি নয়: আপনি একটি গুণিতক যোগ করেছেন",
            "causal_attention no mask": "x-এর আকার {shape} ও {heads}টি হেডে: কোনো causal "
            "মাস্ক নেই; F.scaled_dot_product_attention-এ is_causal=True দিন",
        },
    )
    monkeypatch.setattr(language, "_PACKAGED", tmp_path)
    monkeypatch.setenv(language.LANGUAGE_VAR, "bn")


class TinyGPT(nn.Module):
    """What check_pad_vocabulary needs of a model: a tok embedding and a head tied to it."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, 8)
        self.head = nn.Linear(8, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.tok(tokens))


def pad_by_adding(model: TinyGPT, multiple: int) -> TinyGPT:
    """A wrong answer: a multiple added to the vocabulary, not rounded up to one."""
    old = model.tok.weight.detach()
    model.tok = nn.Embedding(old.shape[0] + multiple, old.shape[1], dtype=old.dtype)
    with torch.no_grad():
        model.tok.weight[: old.shape[0]] = old
    model.head.weight = model.tok.weight
    return model


def test_a_wrong_padding_gets_the_learners_language(bengali):
    with pytest.raises(CheckFailed) as failure:
        check_pad_vocabulary(pad_by_adding, TinyGPT, (), [(13, 8)])
    assert str(failure.value) == (
        "13 টোকেনের শব্দভান্ডার 8-এর গুণিতকে প্যাড করলে 16টি সারি হয়, 21টি নয়: আপনি একটি গুণিতক যোগ করেছেন"
    )


def test_a_wrong_padding_is_told_in_english_without_a_language(bengali, monkeypatch):
    monkeypatch.delenv(language.LANGUAGE_VAR)
    with pytest.raises(CheckFailed) as failure:
        check_pad_vocabulary(pad_by_adding, TinyGPT, (), [(13, 8)])
    assert str(failure.value) == (
        "a vocabulary of 13, padded to a multiple of 8, has 16 rows, not 21: you added a "
        "multiple to it: round it up to the next multiple instead"
    )


def not_causal(x, w_qkv, w_out, heads):
    """A wrong answer: attention with no causal mask."""
    batch, seq, dim = x.shape

    def split(t):
        return t.view(batch, seq, heads, dim // heads).transpose(1, 2)

    q, k, v = (split(t) for t in (x @ w_qkv.T).split(dim, dim=-1))
    out = nn.functional.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(batch, seq, dim) @ w_out.T


def test_a_named_attention_mistake_gets_the_learners_language(bengali):
    with pytest.raises(CheckFailed) as failure:
        check_causal_attention(not_causal, [(2, 4, 8, 2)])
    assert str(failure.value) == (
        "x-এর আকার (2, 4, 8) ও 2টি হেডে: কোনো causal মাস্ক নেই; "
        "F.scaled_dot_product_attention-এ is_causal=True দিন"
    )
