"""What a name is: one rule for every name a user chooses.

A scenario names itself, its workloads and its matrix axes (and the keys of an axis' inline tables, which
label its configurations), and the inventory hosts and groups its endpoints run on; an inventory names hosts
and groups. Names travel: into file and directory names, argument lists and a remote host's shell, terminals,
HTML and the store. A name made of ASCII letters, digits, ``_``, ``.`` and ``-`` that begins with a letter, a
digit or ``_`` is the same plain text in all of them: it is no path (no ``/``; no leading ``.``, so neither
``..`` nor a hidden file), no option (no leading ``-``), no shell word that splits, quotes or expands, no line
break, tab, escape sequence or look-alike letter.

The rule lives here, beside the model, in a module with no imports of the model's: the inventory loader
takes it from here too, and the model's own imports reach the inventory loader.
"""

from __future__ import annotations

import re

from vnetbench.units import brief

NAME_MAX = 80
# [A-Za-z0-9] is ASCII only (\w would let in every alphabet's letters and digits).
NAME = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{NAME_MAX - 1}}}")
RULE = (f"a name is 1 to {NAME_MAX} ASCII letters, digits, '_', '.' or '-', beginning with a letter, digit "
        "or '_' (names become file names, command arguments and terminal text)")


def is_name(value: object) -> bool:
    return isinstance(value, str) and NAME.fullmatch(value) is not None


def suggestion(value: str) -> str:
    """A name close to `value`, to offer in the message that refuses it."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", value).lstrip(".-")[:NAME_MAX].rstrip("-")
    return name or "name"


def name_problem(value: object, what: str = "") -> str | None:
    """None when `value` is a name; else a sentence for people: what is wrong, the rule and a name to use
    instead. `what` says which name it is ("workload", "matrix axis"); without it the sentence starts at "not
    a name" (for a message that shows the key and the value already)."""
    if is_name(value):
        return None
    if not isinstance(value, str):
        return f"{what + ' ' if what else ''}{brief(value)} is not a name: give a string; {RULE}"
    subject = f"{what} {brief(value)} is not a name" if what else "not a name"
    return f"{subject}: {RULE}; rename it, e.g. {suggestion(value)!r}"



def require_name(value: object, what: str = "") -> str:
    """`value`, if it is a name; else ValueError with :func:`name_problem`'s sentence (for model validators)."""
    problem = name_problem(value, what)
    if problem:
        raise ValueError(problem)
    return value  # type: ignore[return-value]
