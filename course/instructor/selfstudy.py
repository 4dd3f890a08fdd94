"""Self-study notebooks: instant feedback on quiz items without shipping a readable key.

``make selfstudy`` turns each ``source/<a>/<a>.ipynb`` into ``selfstudy/<a>/<a>.ipynb``:
answer cells are cleared as in the release, exercise checks keep their hidden tests (nothing
is graded), and each quiz item's check cell becomes a call to :func:`feedback` with the key
and the explanation *sealed*: the explanation is XOR-ed with a SHA-256 keystream derived from
a random salt and the right letter, and only a salted hash of the right letter is stored.

The seal keeps the answer from being read at a glance before a learner commits to one; it is
NOT secret: with four letters to try, anyone can brute-force it. Self-study is honour-based,
and graded work uses the release, which carries no key at all. This module holds no key.
"""

from __future__ import annotations

import ast
import base64
import copy
import hashlib
import json
import secrets
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

__all__ = [
    "CODE_STUB",
    "QuizItem",
    "build_selfstudy",
    "feedback",
    "grade_id",
    "hidden_region",
    "quiz_items",
    "seal",
    "strip_hidden_markers",
    "unseal",
    "write_selfstudy",
]

CODE_STUB = "# YOUR CODE HERE"  # as c.ClearSolutions.code_stub in nbgrader_config.py
_BEGIN_HIDDEN, _END_HIDDEN = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
_SEAL_VERSION = "sealed-v1"


@dataclass(frozen=True)
class QuizItem:
    """One quiz item as its source check cell states it (``<id>_check``)."""

    item_id: str
    name: str
    choices: str
    key: str
    explanation: str
    points: float
    giveaways: tuple[str, ...] = ()


def grade_id(cell: NotebookNode) -> str | None:
    """The cell's nbgrader ``grade_id``, or None for a cell without nbgrader metadata."""
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def hidden_region(source: str) -> str:
    """The text between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS`` lines."""
    inside, kept = False, []
    for line in source.splitlines():
        if _BEGIN_HIDDEN in line:
            inside = True
        elif _END_HIDDEN in line:
            inside = False
        elif inside:
            kept.append(line)
    return "\n".join(kept)


def strip_hidden_markers(source: str) -> str:
    """The cell source with its hidden-test marker lines removed and their content kept."""
    lines = source.splitlines()
    return "\n".join(x for x in lines if _BEGIN_HIDDEN not in x and _END_HIDDEN not in x)


def _check_answer_calls(code: str) -> Iterator[ast.Call]:
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called == "check_answer":
                yield node


def _keyed_call(cell: NotebookNode) -> dict[str, object] | None:
    """Constant arguments of the hidden ``check_answer(..., key=...)`` call, if any."""
    for call in _check_answer_calls(hidden_region(cell.source)):
        kwargs = {k.arg: _literal(k.value) for k in call.keywords}
        if "key" in kwargs:
            if call.args and isinstance(call.args[0], ast.Constant):
                kwargs.setdefault("name", call.args[0].value)
            return kwargs
    return None


def _literal(node: ast.expr) -> object:
    """A keyword's value when it is a literal (a string, a tuple of strings), else None."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def quiz_items(nb: NotebookNode) -> list[QuizItem]:
    """Every quiz item of a SOURCE notebook, read from the hidden part of its check cell."""
    items = []
    for cell in nb.cells:
        gid = grade_id(cell) or ""
        call = _keyed_call(cell) if gid.endswith("_check") and cell.cell_type == "code" else None
        if call is None:
            continue
        item_id = gid.removesuffix("_check")
        items.append(
            QuizItem(
                item_id=item_id,
                name=str(call.get("name", f"answer_{item_id}")),
                choices=str(call.get("choices", "abcd")),
                key=str(call["key"]).strip().lower(),
                explanation=_dedent(str(call.get("explanation") or "")),
                points=float(cell.metadata["nbgrader"].get("points", 0)),
                giveaways=tuple(str(g) for g in call.get("giveaways") or ()),
            )
        )
    return items


def _dedent(text: str) -> str:
    first, _, rest = text.strip().partition("\n")
    return (first + "\n" + textwrap.dedent(rest)).strip() if rest else first


# --- the seal ------------------------------------------------------------------------------


def _letter_hash(salt: bytes, letter: str) -> str:
    return hashlib.sha256(salt + b"|answer|" + letter.encode()).hexdigest()


def _keystream(salt: bytes, letter: str, n: int) -> bytes:
    blocks = (
        hashlib.sha256(salt + b"|stream|" + letter.encode() + i.to_bytes(4, "big")).digest()
        for i in range((n + 31) // 32)
    )
    return b"".join(blocks)[:n]


def seal(key: str, explanation: str, salt: bytes | None = None) -> str:
    """Seal a key and its explanation into one opaque ASCII string for :func:`feedback`."""
    salt = secrets.token_bytes(16) if salt is None else salt
    text = explanation.encode()
    body = bytes(a ^ b for a, b in zip(text, _keystream(salt, key, len(text)), strict=True))
    payload = {"salt": salt.hex(), "hash": _letter_hash(salt, key), "text": body.hex()}
    blob = base64.b64encode(json.dumps(payload).encode()).decode()
    return f"{_SEAL_VERSION}:{blob}"


def unseal(sealed: str, choices: str = "abcd") -> tuple[str, str]:
    """Open a seal by trying every letter of ``choices``; return (key, explanation)."""
    version, _, blob = sealed.partition(":")
    if version != _SEAL_VERSION:
        raise ValueError(f"not a self-study seal ({version!r}); rebuild with `make selfstudy`")
    payload = json.loads(base64.b64decode(blob))
    salt, body = bytes.fromhex(payload["salt"]), bytes.fromhex(payload["text"])
    for letter in choices:
        if _letter_hash(salt, letter) == payload["hash"]:
            plain = bytes(
                a ^ b for a, b in zip(body, _keystream(salt, letter, len(body)), strict=True)
            )
            return letter, plain.decode()
    raise ValueError("this seal matches none of the choices; rebuild with `make selfstudy`")


_WRONG: dict[str, set[str]] = {}  # item name -> the wrong letters tried in this kernel
TRIES = 2  # wrong letters before the key and the explanation are shown


def feedback(name: str, value: object, sealed: str, choices: str = "abcd") -> None:
    """Print right or wrong for a committed answer: right, the explanation; wrong, a second
    try first (with what to measure), then the key and the explanation. Returns nothing, so
    the cell shows only what it printed."""
    from course.checks.answers import normalise_answer

    try:
        letter = normalise_answer(name, value, choices)
    except AssertionError as err:
        print(f"No feedback yet: {err}\nThen run this cell again.")
        return
    key, explanation = unseal(sealed, choices)
    if letter == key:
        print(f'Right: {name} = "{letter}".\n\n{explanation}')
        return
    wrong = _WRONG.setdefault(name, set())
    wrong.add(letter)
    if len(wrong) < TRIES:
        print(
            f'Not yet: "{letter}" is not what the measurement supports. Run the measuring cell '
            "after this one (if you have not yet), compare what it prints with each option, "
            "then change your answer and run this cell again."
        )
        return
    print(f'Not quite: you chose "{letter}"; the measurement supports "{key}".\n\n{explanation}')


# --- building the self-study notebook ------------------------------------------------------


def _feedback_source(item: QuizItem) -> str:
    sealed = seal(item.key, item.explanation)
    return (
        "from course.instructor.selfstudy import feedback\n\n"
        "# Commit to an answer above, then run this cell: it says right or wrong and why.\n"
        f'feedback("{item.name}", {item.name}, choices="{item.choices}", sealed="{sealed}")'
    )


def build_selfstudy(source_nb: NotebookNode) -> NotebookNode:
    """A self-study notebook from a SOURCE notebook: solutions cleared, quiz checks sealed."""
    from nbgrader.preprocessors import ClearSolutions  # nbgrader's own release step

    nb, _ = ClearSolutions(code_stub={"python": CODE_STUB}).preprocess(copy.deepcopy(source_nb), {})
    items = {f"{q.item_id}_check": q for q in quiz_items(nb)}
    for cell in nb.cells:
        meta = cell.metadata.pop("nbgrader", {})
        gid = meta.get("grade_id")
        if gid in items:
            cell.source = _feedback_source(items[gid])
        else:
            cell.source = strip_hidden_markers(cell.source)
        if meta.get("locked") and not meta.get("solution"):
            cell.metadata.update(editable=False, deletable=False)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def write_selfstudy(source_dir: Path, out_dir: Path) -> list[Path]:
    """Build every ``source_dir/<a>/<a>.ipynb`` into ``out_dir/<a>/<a>.ipynb``."""
    written = []
    for src in sorted(Path(source_dir).glob("*/*.ipynb")):
        if src.stem != src.parent.name:
            continue
        dest = Path(out_dir) / src.parent.name / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(build_selfstudy(nbformat.read(src, as_version=4)), dest)
        written.append(dest)
    return written
