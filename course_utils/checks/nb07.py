"""Notebook 07's deciding halves: from what :mod:`course_utils.checks.evidence.nb07` saw the
learner's ``drop_from_history`` leave in a fake namespace and the learner's
``retry_halving`` return or raise on simulated steps, the verdict and its feedback
(:data:`course_utils.checks.nb07.MESSAGES_07`, and the check cell's own)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_utils.checks.core import answer_and_error, check, matching_mistake
from course_utils.checks.evidence.nb07 import history_after_drop, retry_at_the_bottom, retry_run
from course_utils.checks.values import answered, raised_sentence
from course_utils.feedback import CheckFailed, plain_value
from course_utils.language import Messages


def check_drop_from_history(drop_from_history: Any) -> None:
    """Exercise 07 (b): on a fake notebook namespace (IPython's ``Out``, also named ``_oh``,
    its ``_N`` twins, ``_``, ``__``, ``___``) ``drop_from_history`` must free every tensor
    held there (an ``nn.Parameter`` too) and leave every other entry as it was, ``_``,
    ``__``, ``___`` set to ``""`` where they held a tensor (not deleted). Two arrangements
    (:func:`~course_utils.checks.evidence.nb07.history_after_drop`); the feedback names
    what was left or removed."""
    for tensor_at in (["_", "___"], ["__"]):
        seen = history_after_drop(drop_from_history, tensor_at)
        if "raised" in seen:
            sentence = raised_sentence(seen["raised"])
            if "changed size during iteration" in seen["raised"]["message"]:
                raise CheckFailed(MESSAGES_07["drop changed size"].format(error=sentence))
            raise CheckFailed(sentence)  # what it raised, in the learner's language
        if "impostor" in seen:  # a subclass of a built-in type left in the namespace
            answered(seen)
        out, values = seen["out keys"], seen["values"]
        check(seen["out kept"], MESSAGES_07["drop replaced Out"])
        check(9 not in out or 4 in out, MESSAGES_07["drop parameter kept"])
        left = [f"Out[{key}]" for key in (4, 7, 9) if key in out]
        check(not left, MESSAGES_07["drop Out left"].format(left=", ".join(left)))
        twins = [name for name in ("_4", "_7", "_9") if name in seen["present"]]
        check(not twins, MESSAGES_07["drop twins left"].format(twins=", ".join(twins)))
        check(
            values["Out[5]"] == "a string" and values.get("_5") == "a string",
            MESSAGES_07["drop string removed"],
        )
        for name in ("_", "__", "___"):
            if name in tensor_at:
                check(name in values, MESSAGES_07["drop underscore deleted"].format(name=name))
                check(values[name] == "", MESSAGES_07["drop underscore kept"].format(name=name))
            else:
                check(
                    values.get(name) == f"text {name}",
                    MESSAGES_07["drop underscore string"].format(name=name),
                )
        if seen["alive"]:
            place = seen["alive"][0]
            which = (
                "drop parameter still referenced" if place == "Out[9]" else "drop still referenced"
            )
            raise CheckFailed(MESSAGES_07[which].format(place=place))


def retried(retry_halving: Any, limited: Any, limit: float, batch_size: int) -> tuple[Any, Any]:
    """``retry_halving(limited(limit, attempts, leaks), batch_size)``
    (:func:`~course_utils.checks.evidence.nb07.retry_run`): what it returned, plain data
    (:class:`CheckFailed` for a subclass of a built-in type), and the leaks each attempt
    saw."""
    got, leaks = retry_run(retry_halving, limited, limit, batch_size)
    return answered(got), leaks


def check_retry_halving_down_to_one(retry_halving: Any, limited: Any) -> None:
    """Check a learner's ``retry_halving(step, batch_size)`` (notebook 07) at the bottom:
    it tries a batch of 1 too, and when even that does not fit it raises its own
    ``RuntimeError``, not the OOM error. ``limited(limit, attempts, leaks)`` builds a step
    that fits ``limit`` samples (the notebook's simulated step)."""
    seen = retry_at_the_bottom(retry_halving, limited, 1.5, 24)  # only a batch of 1 fits
    if "raised" in seen:
        raise CheckFailed(MESSAGES_07["retry raised before 1"])
    got = answered(seen)
    check(got == 1, MESSAGES_07["retry not down to 1"].format(got=got))
    seen = retry_at_the_bottom(retry_halving, limited, 0.5, 8)
    if "raised" not in seen:
        raise CheckFailed(MESSAGES_07["retry did not raise"])
    check(not seen["oom"], MESSAGES_07["retry raised OOM"])  # its words may say "out of memory"


#: Notebook 07's check messages, by a stable name (see :data:`MESSAGES_01`).
MESSAGES_07 = Messages(
    "07",
    {
        "after_empty_cache raised": "{error} (on after_empty_cache({case}))",
        "after_empty_cache not a pair": "after_empty_cache({case}) gave {got!r}: return a tuple "
        "of two numbers, (reserved, smi)",
        "after_empty_cache swapped": "after_empty_cache({case}) gave {got}, the two in the other "
        "order: return (reserved, smi), reserved first",
        "after_empty_cache nothing freed": "after_empty_cache({case}) gave {got}, as if "
        "empty_cache() freed nothing: it gives the cached blocks (reserved but not allocated) "
        "back to the driver",
        "after_empty_cache live freed": "after_empty_cache({case}) gave {got}, as if the live "
        "tensors were freed too: empty_cache() frees only cached blocks that no tensor uses",
        "after_empty_cache no context": "after_empty_cache({case}) gave {got}, nvidia-smi "
        "without the CUDA context: nvidia-smi shows what PyTorch reserved plus the context, "
        "which is never freed",
        "after_empty_cache old smi": "after_empty_cache({case}) gave {got}: nvidia-smi still "
        "counts the reserved memory from before empty_cache(); it shows what is reserved after "
        "it, plus the context",
        "after_empty_cache wrong": "after_empty_cache({case}) gave {got}: after empty_cache() "
        "PyTorch keeps reserved what live tensors use, and nvidia-smi shows that plus the CUDA "
        "context (100 MiB allocated of 600 reserved, a 300 MiB context: (100, 400))",
        "retry not down to 1": "only a batch of 1 fits here: halve 24, 12, 6, 3 down to 1 and "
        "try that too (your function gave {got})",
        "retry raised before 1": "only a batch of 1 fits here: halve 24, 12, 6, 3 down to 1 and "
        "try that too (your function gave a RuntimeError)",
        "retry raised OOM": "raise your own RuntimeError, not the OOM error",
        "retry did not raise": "when not even a batch of 1 fits, raise RuntimeError",
        "drop changed size": "{error}: you deleted from the dict while looping over it; loop "
        "over a copy, list(history.items())",
        "drop replaced Out": "IPython keeps the output history in one dict named both Out and "
        "_oh: delete the tensor entries from it, do not replace it",
        "drop parameter kept": "an nn.Parameter is a tensor too (a subclass): test "
        "isinstance(value, torch.Tensor), not type(value) == torch.Tensor",
        "drop Out left": "{left} still hold tensors: delete them from Out",
        "drop twins left": "{twins} still hold the tensors of Out: each Out[N] has a twin "
        "variable _N; delete it too (namespace.pop(f'_{{N}}', None))",
        "drop string removed": "Out[5] and _5 held a string: keep history entries that hold no "
        "tensor",
        "drop underscore deleted": '{name} held a tensor: set it to "", do not delete it '
        "(IPython sets _, __ and ___ after each output; a deleted one is a NameError until "
        "then)",
        "drop underscore kept": '{name} held a tensor: set it to ""',
        "drop underscore string": '{name} held a string: leave it as it is (set it to "" only '
        "when it holds a tensor)",
        "drop still referenced": "the tensor of {place} is still referenced somewhere: keep no "
        "reference to the tensors you remove",
        "drop parameter still referenced": "the tensor of {place}, an nn.Parameter is still "
        "referenced somewhere: keep no reference to the tensors you remove",
    },
)


#: Exercise 07 (a)'s cases (allocated, reserved, context) in MiB.
AFTER_EMPTY_CACHE_CASES = [(512, 1536, 400), (0, 2048, 300), (700, 1000, 250), (96, 900, 500)]


def check_after_empty_cache(after_empty_cache: Callable[[int, int, int], Any]) -> None:
    """Exercise 07 (a): ``after_empty_cache(allocated, reserved, context)`` gives
    ``(reserved, smi)`` after ``empty_cache()`` on :data:`AFTER_EMPTY_CACHE_CASES`; the
    feedback names the usual mistake every result matches (the pair swapped, nothing or
    everything freed, the context left out, nvidia-smi read before), else describes one."""
    got: list[Any] = []
    for case in AFTER_EMPTY_CACHE_CASES:
        shown = ", ".join(map(str, case))
        out, error = answer_and_error(after_empty_cache, *case)
        check(
            error is None, MESSAGES_07["after_empty_cache raised"].format(case=shown, error=error)
        )
        pair = isinstance(plain_value(out, f"after_empty_cache({shown})"), tuple | list)
        pair = pair and len(out) == 2
        check(
            pair and all(isinstance(v, int | float) and not isinstance(v, bool) for v in out),
            MESSAGES_07["after_empty_cache not a pair"].format(case=shown, got=out),
        )
        got.append(tuple(out))
    right = [(a, a + c) for a, _, c in AFTER_EMPTY_CACHE_CASES]
    if got == right:
        return
    mistakes = {
        "after_empty_cache swapped": [(a + c, a) for a, _, c in AFTER_EMPTY_CACHE_CASES],
        "after_empty_cache nothing freed": [(r, r + c) for _, r, c in AFTER_EMPTY_CACHE_CASES],
        "after_empty_cache live freed": [(0, c) for _, _, c in AFTER_EMPTY_CACHE_CASES],
        "after_empty_cache no context": [(a, a) for a, _, _ in AFTER_EMPTY_CACHE_CASES],
        "after_empty_cache old smi": [(a, r + c) for a, r, c in AFTER_EMPTY_CACHE_CASES],
    }
    name = matching_mistake(got, mistakes, right, lambda x, y: x == y)
    first = next(i for i, (x, y) in enumerate(zip(got, right, strict=True)) if x != y)
    shown = ", ".join(map(str, AFTER_EMPTY_CACHE_CASES[first]))
    raise CheckFailed(
        MESSAGES_07[name or "after_empty_cache wrong"].format(case=shown, got=got[first])
    )
