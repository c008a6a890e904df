"""The check messages of classroom, distributed, lightning, capstone, techniques and the
checks' deciding halves (course_utils.checks.nbNN) are kept in Messages tables
(course_utils/language.py): every name the code looks up is in its table, and a wrong answer
gets its feedback from the learner's language's catalog."""

from __future__ import annotations

import ast
import importlib
import itertools
import json
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

import course_utils.checks
from course_utils import capstone, distributed, language, lightning, techniques
from course_utils.checks import core, nb01
from course_utils.checks import nb01 as checks_nb01
from course_utils.checks import nb02 as checks_nb02
from course_utils.checks import nb03 as checks_nb03
from course_utils.checks import nb04 as checks_nb04
from course_utils.checks import nb05 as checks_nb05
from course_utils.checks import nb06 as checks_nb06
from course_utils.checks import nb07 as checks_nb07
from course_utils.checks import nb08 as checks_nb08
from course_utils.checks.evidence import nb03 as evidence_nb03
from course_utils.language import LANGUAGE_VAR, Messages, template_fields

ROOT = Path(__file__).resolve().parent.parent
#: The checks split along the grader's boundary (course_utils.checks): both halves.
CHECK_MODULES = [
    importlib.import_module(found.name)
    for found in pkgutil.walk_packages(course_utils.checks.__path__, "course_utils.checks.")
]
MODULES = [core, distributed, lightning, capstone, techniques, *CHECK_MODULES]

#: Every table of these modules, by the name the code gives it.
TABLES: dict[str, Messages] = {
    name: value
    for module in MODULES
    for name, value in vars(module).items()
    if name.startswith("MESSAGES_") and isinstance(value, Messages)
}


def _looked_up(path: Path) -> list[tuple[str, str, int]]:
    """``(table, name, line)`` of each literal name looked up in a table (``MESSAGES_NN[...]``,
    the literal strings of the subscript, both sides of a conditional too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id.startswith("MESSAGES_")
        ):
            parts = list(ast.walk(node.slice))
            if any(isinstance(part, ast.JoinedStr) for part in parts):
                continue  # a name put together: test_the_names_made_by_code_are_in_their_tables
            for part in parts:
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found.append((node.value.id, part.value, node.lineno))
    return found


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_name_the_code_looks_up_is_in_its_table(module):
    path = Path(module.__file__)
    missing = [
        f"{path.name}:{line}: {table}[{name!r}]"
        for table, name, line in _looked_up(path)
        if table not in TABLES or name not in TABLES[table]
    ]
    assert not missing


def test_the_names_made_by_code_are_in_their_tables():
    """Names put together or kept apart from the lookup (mistakes, PyTorch's errors, the
    tensors of 03 (b)'s batch) are in the tables too."""
    names = [
        (checks_nb03.MESSAGES_03, f"to_gpu {tensor} {mistake}")
        for tensor, mistake in itertools.product(
            evidence_nb03.TO_GPU_TENSORS, ("rebuilt", "not copied", "not its copy", "blocking")
        )
        if (tensor, mistake) != ("mask", "blocking")  # the mask is not pinned
    ]
    names += [(checks_nb04.MESSAGES_04, name) for name in checks_nb04._AMP_STEP_ERRORS.values()]
    names += [(checks_nb04.MESSAGES_04, name) for name in checks_nb04._CLIPPING_MISTAKES]
    names += [(checks_nb01.MESSAGES_01, name) for name in nb01._time_it_mistakes([1.0], [1.0])]
    names += [(checks_nb04.MESSAGES_04, n) for n in checks_nb04._largest_batch_mistakes(9, 1, 2)]
    names += [
        (checks_nb04.MESSAGES_04A, n) for n in checks_nb04._adam_mistakes(torch.nn.Linear(1, 1))[1]
    ]
    names += [(checks_nb06.MESSAGES_06, name) for name in checks_nb06.RANK_MISTAKES]
    names += [(checks_nb01.MESSAGES_PRECISION_RULE, n) for n in checks_nb01.PRECISION_RULE_MISTAKES]
    assert [name for table, name in names if name not in table] == []


@pytest.mark.parametrize("table", sorted(TABLES), ids=str)
def test_each_template_is_a_string_with_named_fields(table):
    """A translator gets named fields ({got}, never {} or {0}) and no f-string was left."""
    for name, template in TABLES[table].english.items():
        assert isinstance(template, str) and template.strip(), name
        for field in template_fields(template):
            assert field[1:2].isalpha() or field[1:2] == "_", (name, field)


# -- the learner's language -----------------------------------------------------------------


def _catalog(folder: Path, code: str, entries: list[tuple[Messages, str, str]]) -> None:
    lines = ['msgid ""', 'msgstr ""', '"Content-Type: text/plain; charset=UTF-8\\n"', ""]
    for table, name, text in entries:
        lines += [f"msgctxt {json.dumps(table.context(name))}"]
        lines += [f"msgid {json.dumps(table.english[name])}"]
        lines += [f"msgstr {json.dumps(text, ensure_ascii=False)}", ""]
    target = folder / code / language.MESSAGES_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines), encoding="utf-8")


def _unpinned_loader(dataset, batch_size, workers=0):
    return DataLoader(dataset, batch_size, shuffle=True, num_workers=workers)


def _parse_with_units_only(line):
    """Right on lines with units; a line printed with nounits is read one value short."""
    values = [float(part.split()[0]) if part[:1].isdigit() else None for part in line.split(", ")]
    return values[:1] if line == "1024, 35" else values


def _unscaled_backward(*args):
    raise RuntimeError("_scale is None")  # what a GradScaler raises when it scaled no loss


def _raising_step(every, lost_at):
    raise ValueError("no checkpoint")


#: answer_or_error's sentence in Bengali.
RAISED_BN = "আপনার ফাংশন {kind} তুলেছে: {error}"

#: One wrong answer per table: (the table, the message's name, its Bengali, the check).
WRONG_ANSWERS: dict[str, tuple[Messages, str, str, Callable[[], object]]] = {
    "checks": (
        core.MESSAGES_CHECKS,
        "close number",
        "{what} হল {actual:.6g}, প্রত্যাশিত {expected:.6g} (rtol={rtol:g} এর মধ্যে)",
        lambda: core.check_close(2.0, 3.0, "the speed-up"),
    ),
    "01": (
        checks_nb01.MESSAGES_01,
        "mixed_forward autocast",
        "{gpu} এর জন্য model(x) চালান torch.autocast(x.device.type, dtype=torch.{dtype}) এর মধ্যে",
        lambda: nb01.check_mixed_forward(lambda model, x, capability: model(x), (8, 0)),
    ),
    "03": (
        checks_nb03.MESSAGES_03,
        "gpu_loader not pinned",
        "pin_memory=True ছাড়া ব্যাচগুলি পেজযোগ্য মেমরিতে থাকে",
        lambda: checks_nb03.check_gpu_loader(_unpinned_loader),
    ),
    "02": (
        checks_nb02.MESSAGES_02,
        "parse nounits",
        "nounits দিয়ে ছাপা মানের কোনো একক নেই",
        lambda: checks_nb02.check_parses_other_lines(_parse_with_units_only),
    ),
    "04": (
        checks_nb04.MESSAGES_04,
        "amp_step scale is None",
        "লসের বদলে scaler.scale(loss) এর উপর backward ডাকুন (PyTorch তুলেছে: {error})",
        lambda: checks_nb04.run_amp_step_against_fp32(_unscaled_backward),
    ),
    "04a": (
        checks_nb04.MESSAGES_04A,
        "adam_state dtype",
        "একটি {dtype} nn.Linear(10, 5) পায় {want} বাইট Adam অবস্থা, {got} নয়: প্রতি উপাদানে "
        "p.element_size() বাইট",
        lambda: checks_nb04.check_adam_state_follows_dtype(lambda model: 2 * 4 * 55 + 8),
    ),
    "05": (
        checks_nb05.MESSAGES_05,
        "resume raised",
        "ত্রুটি resume_step({every}, {lost_at}): {error}",
        lambda: checks_nb05.check_resume_step(_raising_step, _raising_step, [(5, 7)]),
    ),
    "06": (
        checks_nb06.MESSAGES_06,
        "average own",
        "প্রতিটি প্রক্রিয়া নিজের গ্রেডিয়েন্ট রেখেছে",
        lambda: checks_nb06.check_averaged_gradients(
            [
                {"own": torch.ones(2), "result": torch.ones(2)},
                {"own": -torch.ones(2), "result": -torch.ones(2)},
            ],
            torch.zeros(2),
        ),
    ),
    "07": (
        checks_nb07.MESSAGES_07,
        "retry did not raise",
        "যখন 1 এর ব্যাচও আঁটে না, RuntimeError তুলুন",
        lambda: checks_nb07.check_retry_halving_down_to_one(
            lambda step, batch_size: 1, lambda limit, attempts, leaks: lambda size: None
        ),
    ),
    "08": (
        checks_nb08.MESSAGES_08,
        "loop empties the cache",
        "আপনি লুপে torch.cuda.empty_cache() ডাকেন: এটি বাদ দিন",
        lambda: checks_nb08.check_loop_habits(
            SimpleNamespace(
                item_calls=0, steps=10, empty_cache_calls=10, unmoved_labels=0, unmoved_inputs=0
            )
        ),
    ),
}


@pytest.mark.parametrize("table", list(WRONG_ANSWERS))
def test_a_wrong_answer_gets_the_translated_message(table, tmp_path, monkeypatch):
    messages, name, bengali, wrong = WRONG_ANSWERS[table]
    assert template_fields(bengali) == template_fields(messages.english[name])
    monkeypatch.setattr(language, "_PACKAGED", tmp_path)
    entries = [(messages, name, bengali)]
    if table != "checks":  # the learner's error inside another message: translated too
        entries.append((core.MESSAGES_CHECKS, "function raised", RAISED_BN))
    _catalog(tmp_path, "bn", entries)
    monkeypatch.delenv(LANGUAGE_VAR, raising=False)
    with pytest.raises(core.CheckFailed) as english:
        wrong()
    monkeypatch.setenv(LANGUAGE_VAR, "bn")
    with pytest.raises(core.CheckFailed) as translated:
        wrong()
    words = [piece for piece in re.split(r"\{[^{}]*\}", bengali) if piece.strip()]
    assert words and all(piece in str(translated.value) for piece in words), translated.value
    assert str(english.value) != str(translated.value)
    english_words = re.split(r"\{[^{}]*\}", messages.english[name])
    assert all(piece in str(english.value) for piece in english_words), english.value


def test_an_answer_that_raised_is_told_in_the_language_and_still_counts_as_raised(
    tmp_path, monkeypatch
):
    """answer_or_error's sentence is translated; the checks tell it by is_raised(), not by its
    English words, so what they decide does not depend on the language."""
    monkeypatch.setattr(language, "_PACKAGED", tmp_path)
    resume = "ত্রুটি resume_step({every}, {lost_at}): {error}"
    _catalog(
        tmp_path,
        "bn",
        [
            (core.MESSAGES_CHECKS, "function raised", RAISED_BN),
            (checks_nb05.MESSAGES_05, "resume raised", resume),
        ],
    )
    monkeypatch.setenv(LANGUAGE_VAR, "bn")
    said = core.answer_or_error(int, "seven")
    assert said.startswith("আপনার ফাংশন ValueError তুলেছে") and core.is_raised(said)
    assert not core.is_raised("your function raised ValueError: no")  # an answer's text
    with pytest.raises(core.CheckFailed) as failed:
        checks_nb05.check_resume_step(_raising_step, _raising_step, [(5, 7)])
    assert str(failed.value) == (
        "ত্রুটি resume_step(5, 7): আপনার ফাংশন ValueError তুলেছে: no checkpoint"
    )
