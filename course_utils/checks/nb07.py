"""Notebook 07's deciding halves: from what :mod:`course_utils.checks.evidence.nb07` saw the
learner's ``drop_from_history`` leave in a fake namespace and the learner's
``retry_halving`` return or raise on simulated steps, the verdict and its feedback
(:data:`course_utils.classroom.MESSAGES_07`, and the check cell's own)."""

from __future__ import annotations

from typing import Any

from course_utils.checks.evidence.nb07 import history_after_drop, retry_at_the_bottom, retry_run
from course_utils.checks.values import answered, raised_sentence
from course_utils.classroom import MESSAGES_07, CheckFailed, check


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
