"""Cheap features of a question's text that a router reads beside its embedding.

An embedding says what a question is about; how long and how dense it is says something of
how hard it is (a long word problem with many numbers, a competition problem full of LaTeX,
code to write), which the embedding of a short topic-like vector blurs. Measured on the
simulated pool's held-out items, adding these to the embedding raised the area under the
router's accuracy/cost curve from 0.771 to 0.776, and they cost microseconds per question.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SENTENCE_END = re.compile(r"[.?!](?:\s|$)")
_CODE = re.compile(r"```|\bdef |\bassert |\breturn\b|\bpython\b|\bfunction\b", re.IGNORECASE)


def _row(text: str) -> list[float]:
    return [
        math.log1p(len(text)),
        math.log1p(len(text.split())),
        math.log1p(sum(c.isdigit() for c in text)),
        math.log1p(len(_NUMBER.findall(text))),
        math.log1p(text.count("$") + text.count("\\")),  # LaTeX
        math.log1p(text.count("\n")),
        float(_CODE.search(text) is not None),
        math.log1p(len(_SENTENCE_END.findall(text))),
    ]


# The columns of question_features, in order.
QUESTION_FEATURES = (
    "log_chars",
    "log_words",
    "log_digits",
    "log_numbers",
    "log_latex_marks",
    "log_newlines",
    "code_marker",
    "log_sentences",
)


def question_features(texts: Sequence[str]) -> npt.NDArray[np.float64]:
    """(questions, features): the QUESTION_FEATURES of each text, unscaled."""
    return np.array([_row(text) for text in texts], dtype=np.float64).reshape(
        len(texts), len(QUESTION_FEATURES)
    )
