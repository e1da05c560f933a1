"""ListOps (Long Range Arena, Tay et al. 2020), generated locally and deterministically.

Expressions are nested lists of operators over digits in prefix notation, e.g.
``[MAX 4 3 [MIN 2 3 ] 1 0 ]`` (= 4).  The generator follows LRA's ``lra_benchmarks/data/listops.py``:
a node below ``max_depth`` is an operator with probability 0.25 (else a digit), an operator has
2..``max_args`` arguments, and expressions are kept when their length in tokens is within
[``min_length``, ``max_length``] (LRA: strictly between 500 and 2000) and not seen before.

Operators: MIN, MAX, MED and SM (sum mod 10).  MED follows LRA's ``int(np.median(args))``: for an
even number of arguments it is the mean of the two middle values rounded down, e.g. MED 1 2 = 1,
MED 1 4 = 2.  Unlike LRA, the text has no parentheses (LRA writes them and strips them on input).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import random


from mhalab.errors import ConfigError

if TYPE_CHECKING:
    from datasets import DatasetDict

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
DIGITS = tuple(str(d) for d in range(10))
TOKENS = OPERATORS + (END,) + DIGITS  # the ListOps vocabulary, special tokens excluded
LABEL_NAMES = list(DIGITS)
VALUE_P = 0.25  # LRA: probability that a node below max_depth is an operator


def apply_op(op: str, args: list[int]) -> int:
    """The value of operator ``op`` (e.g. ``"[MED"``) applied to the digits ``args``."""
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[SM":
        return sum(args) % 10
    if op == "[MED":
        s = sorted(args)
        mid = len(s) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2  # == int(np.median(s))
    raise ValueError(f"unknown ListOps operator {op!r}")


def evaluate(expression: str | list[str]) -> int:
    """The value (0-9) of a ListOps expression given as text or as a list of tokens."""
    tokens = expression.split() if isinstance(expression, str) else list(expression)
    stack: list[tuple[str, list[int]]] = []  # open operators and their arguments so far
    result = None
    for tok in tokens:
        if tok in OPERATORS:
            stack.append((tok, []))
            continue
        if tok == END:
            if not stack:
                raise ValueError("unbalanced ']' in ListOps expression")
            op, args = stack.pop()
            if not args:
                raise ValueError(f"ListOps operator {op} has no arguments")
            value = apply_op(op, args)
        elif tok in DIGITS:
            value = int(tok)
        else:
            raise ValueError(f"unknown ListOps token {tok!r}")
        if stack:
            stack[-1][1].append(value)
        elif result is None:
            result = value
        else:
            raise ValueError("ListOps expression has more than one root")
    if stack or result is None:
        raise ValueError("incomplete ListOps expression")
    return result


class _TooLong(Exception):
    """Raised to abandon an expression as soon as it exceeds ``max_length`` tokens."""


def _draw(rng: random.Random, depth: int, max_depth: int, max_args: int, max_length: int, out: list[str]) -> None:
    """Append one random (sub)expression to ``out``, drawn the way LRA's ``generate_tree`` draws it."""
    if len(out) >= max_length:
        raise _TooLong
    if depth >= max_depth or rng.random() > VALUE_P:
        out.append(DIGITS[rng.randrange(10)])
        return
    n_args = rng.randint(2, max_args)
    out.append(OPERATORS[rng.randrange(len(OPERATORS))])
    for _ in range(n_args):
        _draw(rng, depth + 1, max_depth, max_args, max_length, out)
    if len(out) >= max_length:
        raise _TooLong
    out.append(END)


def generate_expression(rng: random.Random, max_depth: int, max_args: int, max_length: int) -> list[str] | None:
    """One random expression as a token list, or None if it is longer than ``max_length`` tokens."""
    out: list[str] = []
    try:
        _draw(rng, 1, max_depth, max_args, max_length, out)
    except _TooLong:
        return None
    return out


def generate_listops(
    n: int, seed: int, max_depth: int, max_args: int, min_length: int, max_length: int, max_tries: int | None = None
) -> list[tuple[str, int]]:
    """``n`` distinct (expression, value) pairs, the same for the same arguments on every run."""
    rng = random.Random(seed)  # seeded by an int: independent of PYTHONHASHSEED
    seen: set[str] = set()
    examples: list[tuple[str, int]] = []
    max_tries = max_tries if max_tries is not None else 1000 * n + 100_000
    for _ in range(max_tries):
        if len(examples) == n:
            break
        tokens = generate_expression(rng, max_depth, max_args, max_length)
        if tokens is None or len(tokens) < min_length:
            continue
        text = " ".join(tokens)
        if text not in seen:
            seen.add(text)
            examples.append((text, evaluate(tokens)))
    else:
        if len(examples) < n:
            raise ConfigError(
                f"data.listops could only generate {len(examples)} of {n} distinct expressions with "
                f"min_length={min_length}, max_length={max_length}, max_depth={max_depth}, max_args={max_args}; "
                "widen the length range or raise max_depth/max_args."
            )
    return examples


def load_listops(
    n_train: int, n_val: int, n_test: int, seed: int, max_depth: int, max_args: int, min_length: int, max_length: int
) -> DatasetDict:
    """Train/validation/test splits with columns ``id``, ``text``, ``label``; no expression is in two splits."""
    from datasets import Dataset, DatasetDict

    examples = generate_listops(n_train + n_val + n_test, seed, max_depth, max_args, min_length, max_length)
    bounds = {"train": (0, n_train), "validation": (n_train, n_train + n_val), "test": (n_train + n_val, len(examples))}
    return DatasetDict(
        {
            split: Dataset.from_dict(
                {
                    "id": [f"listops-{i}" for i in range(lo, hi)],
                    "text": [examples[i][0] for i in range(lo, hi)],
                    "label": [examples[i][1] for i in range(lo, hi)],
                }
            )
            for split, (lo, hi) in bounds.items()
        }
    )
