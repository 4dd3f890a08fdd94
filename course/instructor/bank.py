"""The quiz bank as data, and the figures that say whether an item's form gives its key away.

    python -m course.instructor.bank        # every item's form, then the bank's figures

Each item of a source notebook is its question cell (``<id>_question``: the stem, then the
options as ``* a) ...`` bullets) and its check cell (the key, the explanation and the
give-aways, from the hidden ``check_answer`` call, read by ``selfstudy.quiz_items``). A strong
student who knows nothing of the topic still scores on a bank whose keys are the longest
option, the only hedged one or the only one with a number, the one that repeats the parts the
other options share, the only negated one, or always the same letter (Haladyna, Downing &
Rodriguez 2002, "A review of multiple-choice item-writing guidelines"; the cues beyond length
are in ``course.instructor.cues``); :func:`form_problems` names every such cue against
:data:`LIMITS`, and the tests hold the whole bank to them.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from course.instructor import cues
from course.instructor.selfstudy import grade_id, quiz_items
from course.instructor.workcopies import COURSE_ORDER

__all__ = [
    "LIMITS",
    "Form",
    "Item",
    "bank",
    "form",
    "form_problems",
    "giveaway_leaks",
    "items_of",
    "prose",
    "shown_before",
]

REPO = Path(__file__).resolve().parents[2]

LIMITS = {
    "key_longest": 0.25,  # share of items whose key is the strictly longest option
    "always_longest": 0.30,  # share of the quiz points that always picking the longest scores
    "always_shortest": 0.30,  # the same, always picking the shortest
    "always_convergent": 0.30,  # the same, picking the option that repeats the shared parts
    "always_lone_negation": 0.30,  # the same, picking the lone negated (or plain) option
    "spread": 1.5,  # within an item, longest option / shortest option, in characters
    "letter_low": 0.125,  # every letter keys at least this share of the items
    "letter_high": 0.375,  # and at most this share
}
_OPTION = re.compile(r"^\* ([a-z])\) ", re.MULTILINE)
_PICKS = ("always_longest", "always_shortest", "always_convergent", "always_lone_negation")


@dataclass(frozen=True)
class Item:
    """One quiz item: where it is, what it asks, its options, key, points and give-aways."""

    assignment: str
    item_id: str
    stem: str
    options: dict[str, str]
    key: str
    points: float
    giveaways: tuple[str, ...]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _question(source: str) -> tuple[str, dict[str, str]]:
    """The stem and the options of a question cell's markdown (options end at a blank line)."""
    parts = _OPTION.split(source)
    stem, options = parts[0], {}
    for letter, text in zip(parts[1::2], parts[2::2], strict=True):
        options[letter] = _flat(text.split("\n\n")[0])
    lines = [x for x in stem.splitlines() if not x.startswith("#") and not x.startswith("*Diff")]
    return _flat("\n".join(lines)), options


def items_of(path: Path) -> list[Item]:
    """Every quiz item of one source notebook, in notebook order."""
    nb = nbformat.read(path, as_version=4)
    keyed = {q.item_id: q for q in quiz_items(nb)}
    found = []
    for cell in nb.cells:
        item_id = (grade_id(cell) or "").removesuffix("_question")
        if item_id not in keyed or not (grade_id(cell) or "").endswith("_question"):
            continue
        stem, options = _question(cell.source)
        q = keyed[item_id]
        found.append(Item(path.parent.name, item_id, stem, options, q.key, q.points, q.giveaways))
    return found


def bank(source: Path = REPO / "source") -> list[Item]:
    """Every item of every source notebook ``source/<a>/<a>.ipynb``."""
    paths = sorted(p for p in source.glob("*/*.ipynb") if p.stem == p.parent.name)
    return [item for path in paths for item in items_of(path)]


@dataclass(frozen=True)
class Form:
    """The bank's form figures: what a student who knows nothing would score, and how."""

    items: int
    points: float
    key_longest: list[str]
    always_longest: float
    always_shortest: float
    letters: dict[str, int]
    spread: dict[str, float]
    lone_hedge: list[str]
    lone_number: list[str]
    always_convergent: float
    parted: dict[str, float]  # each multi-part item: the share of its points convergence wins
    convergent_parted: float  # the share of the multi-part items' points it wins
    always_lone_negation: float
    lone_negated: dict[str, float]  # each item with a lone negated (or plain) one: what it wins
    measured: list[str]  # items whose stem says "measured" (reported; see cues)


def form(items: Sequence[Item]) -> Form:
    """The form figures of ``items``."""
    points = sum(i.points for i in items) or 1.0
    longest = [
        i.item_id
        for i in items
        if all(len(i.options[i.key]) > len(v) for k, v in i.options.items() if k != i.key)
    ]
    parted, lone = cues.won(items, cues.convergent), cues.won(items, cues.lone_negation)
    spread = {
        i.item_id: max(map(len, i.options.values())) / max(1, min(map(len, i.options.values())))
        for i in items
    }
    return Form(
        items=len(items),
        points=points,
        key_longest=longest,
        always_longest=sum(cues.expected(i, cues.longest(i.options)) for i in items) / points,
        always_shortest=sum(cues.expected(i, cues.shortest(i.options)) for i in items) / points,
        letters=dict(sorted(Counter(i.key for i in items).items())),
        spread=spread,
        lone_hedge=[i.item_id for i in items if cues.lone(i.options, cues.HEDGE) == [i.key]],
        lone_number=[i.item_id for i in items if cues.lone(i.options, cues.DIGIT) == [i.key]],
        always_convergent=cues.share(items, parted),
        parted=parted,
        convergent_parted=cues.share([i for i in items if i.item_id in parted], parted),
        always_lone_negation=cues.share(items, lone),
        lone_negated=lone,
        measured=[i.item_id for i in items if cues.says_measured(i.stem)],
    )


def _wins(f: Form, pick: str) -> str:
    """Where a cue's pick wins points, for its problem's message (nothing for length)."""
    won = {"always_convergent": f.parted, "always_lone_negation": f.lone_negated}.get(pick, {})
    items = [k for k, w in won.items() if w > 0]
    return f"; it wins in {', '.join(items)}" if items else ""


def form_problems(f: Form, letters: str = "abcd") -> list[str]:
    """Every way the bank's form points at its keys, against :data:`LIMITS`, in words."""
    problems = []
    share = len(f.key_longest) / max(1, f.items)
    if share > LIMITS["key_longest"]:
        problems.append(
            f"the key is the strictly longest option in {len(f.key_longest)} of {f.items} "
            f"items ({share:.0%}, limit {LIMITS['key_longest']:.0%}): {', '.join(f.key_longest)}"
        )
    problems += [
        f"{pick.replace('_', ' ')} scores {getattr(f, pick):.0%} of the quiz points "
        f"(limit {LIMITS[pick]:.0%}){_wins(f, pick)}"
        for pick in _PICKS
        if getattr(f, pick) > LIMITS[pick]
    ]
    wide = {k: round(v, 2) for k, v in f.spread.items() if v > LIMITS["spread"]}
    if wide:
        problems.append(
            f"options of very different lengths (longest / shortest over "
            f"{LIMITS['spread']}): {wide}"
        )
    for letter in letters:
        share = f.letters.get(letter, 0) / max(1, f.items)
        if not LIMITS["letter_low"] <= share <= LIMITS["letter_high"]:
            problems.append(
                f'"{letter}" is the key of {f.letters.get(letter, 0)} of {f.items} items '
                f"({share:.0%}; each letter between {LIMITS['letter_low']:.1%} and "
                f"{LIMITS['letter_high']:.1%})"
            )
    if f.lone_hedge:
        problems.append(f"the key is the only hedged option in {', '.join(f.lone_hedge)}")
    if f.lone_number:
        problems.append(f"the key is the only option with a number in {', '.join(f.lone_number)}")
    return problems


def prose(source: str) -> str:
    """The words a module says rather than does: its docstrings and comments, flattened."""
    parts = [
        t.string.lstrip("#")
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type == tokenize.COMMENT
    ]
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    parts += [
        ast.get_docstring(node) or ""
        for node in ast.walk(ast.parse(source))
        if isinstance(node, documented)
    ]
    return _flat(" ".join(parts))


def shown_before(assignment: str, assignments: Sequence[str]) -> list[str]:
    """The assignments whose notebooks a student of ``assignment`` has seen: it and the ones
    before it in course order (a later notebook may build on an earlier one's answers)."""
    order = {a: i for i, a in enumerate(COURSE_ORDER)}
    mine = order.get(assignment, len(order))
    return [a for a in assignments if order.get(a, len(order)) <= mine]


def _cell_text(cell: NotebookNode, outputs: bool) -> str:
    if not outputs:
        return cell.source
    parts = []
    for out in cell.get("outputs", []):
        parts.append(str(out.get("text", "")))
        parts += [str(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
        parts += [str(out.get("evalue", ""))]
    return "\n".join(parts)


def giveaway_leaks(nb: NotebookNode, items: Sequence[Item], outputs: bool = False) -> list[str]:
    """Where ``nb`` shows an item's give-away, each as "item: pattern in cell" (none: clean).

    Sources are read in every cell but the item's own question (whose options must hold the
    key's wording); with ``outputs``, the outputs of every cell but the item's own measuring
    cells (``<id>_measure...``), which a student must run and interpret.
    """
    found = []
    for item in items:
        patterns = [re.compile(g, re.IGNORECASE) for g in item.giveaways]
        for cell in nb.cells:
            gid = grade_id(cell) or "?"
            own = f"{item.item_id}_measure" if outputs else f"{item.item_id}_question"
            if gid.startswith(own):
                continue
            text = _flat(_cell_text(cell, outputs))
            found += [f"{item.item_id}: {p.pattern!r} in {gid}" for p in patterns if p.search(text)]
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Print every item's option lengths and what its cues win, then the bank's figures; 1 when
    a limit is broken."""
    items = bank(Path(argv[0]) if argv else REPO / "source")
    f = form(items)
    for i in items:
        lengths = "  ".join(
            f"{k}{'*' if k == i.key else ' '}{len(v):4}" for k, v in i.options.items()
        )
        won = [
            (c, w.get(i.item_id)) for c, w in (("converging", f.parted), ("lone", f.lone_negated))
        ]
        cued = "".join(f"  {c} {w:.0%}" for c, w in won if w is not None)
        print(f"{i.assignment:15} {i.item_id:17} {i.points:3g} pts  {lengths}{cued}")
    print(
        f"\n{f.items} items, {f.points:g} points: key strictly longest in {len(f.key_longest)} "
        f"({len(f.key_longest) / max(1, f.items):.0%}); always longest {f.always_longest:.0%}, "
        f"always shortest {f.always_shortest:.0%} of the points; keys {f.letters}\n"
        f"always convergent {f.always_convergent:.0%} of the points ({f.convergent_parted:.0%} "
        f"in the {len(f.parted)} multi-part items), always lone negation "
        f"{f.always_lone_negation:.0%} ({len(f.lone_negated)} items have a lone one)\n"
        f"stems that say measured (no limit: a cue only to one who knows the textbook answer): "
        f"{', '.join(f.measured) or 'none'}"
    )
    problems = form_problems(f)
    for p in problems:
        print(f"  problem: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
