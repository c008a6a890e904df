"""Notebook 09's generated text: every line is a correct addition, the text is the same for
the same seed, and encode/decode are inverses that refuse what they cannot represent."""

from __future__ import annotations

import re

import pytest
import torch

from course_utils.text import ALPHABET, addition_text, decode, encode


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_every_line_is_a_correct_addition_of_numbers_of_at_most_digits_digits(digits):
    text = addition_text(200, digits=digits, seed=3)
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) == 201  # every line ends in a newline
    for line in lines[:-1]:
        match = re.fullmatch(r"(\d+)\+(\d+)=(\d+)", line)
        assert match, line
        a, b, total = map(int, match.groups())
        assert a + b == total, line
        assert a < 10**digits and b < 10**digits
    firsts = {int(line.split("+")[0]) for line in lines[:-1]}
    assert len(firsts) > min(10**digits, 200) // 3  # random numbers, not one repeated


def test_the_seed_decides_the_text():
    assert addition_text(50, seed=1) == addition_text(50, seed=1)
    assert addition_text(50, seed=1) != addition_text(50, seed=2)


@pytest.mark.parametrize(("lines", "digits"), [(0, 2), (5, 0)])
def test_nonsense_sizes_are_refused(lines, digits):
    with pytest.raises(ValueError, match="need lines >= 1 and digits >= 1"):
        addition_text(lines, digits=digits)


def test_encode_and_decode_are_inverses_over_the_alphabet():
    text = addition_text(30, seed=0)
    ids = encode(text)
    assert ids.dtype == torch.long and ids.shape == (len(text),)
    assert int(ids.min()) >= 0 and int(ids.max()) < len(ALPHABET)
    assert decode(ids) == text
    assert decode(ids.tolist()) == text
    assert set(ALPHABET) == set(text)  # every character of the alphabet occurs


def test_encode_and_decode_refuse_what_they_cannot_represent():
    with pytest.raises(ValueError, match=r"outside the alphabet .*\['a', 'x'\]"):
        encode("1+a=x")
    with pytest.raises(ValueError, match=r"token ids outside 0\.\.12"):
        decode([1, 13])
    with pytest.raises(ValueError, match="token ids outside"):
        decode(torch.tensor([-1]))
