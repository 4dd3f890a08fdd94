"""nbgrader's pipelines as the course's config names them: the judge for Execute, loaded late."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute
from traitlets.utils.importstring import import_item

from course.grading import cells, judge
from course.grading.pipelines import autograde_preprocessors, sanitize_preprocessors

REPO = Path(__file__).resolve().parents[2]

# nbgrader's apps imported and the course's nbgrader_config.py loaded, as every nbgrader command
# starts; then what that imported.
LOAD = """
import json, sys
import nbgrader.apps
from traitlets.config.loader import PyFileConfigLoader
config = PyFileConfigLoader("nbgrader_config.py", path=sys.argv[1]).load_config()
pipeline = config.Autograde.autograde_preprocessors
print(json.dumps({"pipeline": pipeline,
                  "imported": [m for m in ("torch", "course.grading.judge", "rfc3987_syntax")
                               if m in sys.modules]}))
"""


def test_the_pipelines_are_nbgraders_own_with_the_judge_for_execute() -> None:
    """Named, do they resolve to nbgrader 0.9.6's pipelines, Execute replaced, cells first?"""
    stock = Autograde.class_traits()
    grading = [import_item(name) for name in autograde_preprocessors()]
    expected = [judge.Judge if cls is Execute else cls
                for cls in stock["autograde_preprocessors"].default()]  # fmt: skip
    assert grading == expected
    assert Execute not in grading
    sanitizing = [import_item(name) for name in sanitize_preprocessors()]
    assert sanitizing == [cells.GradebookCells, *stock["sanitize_preprocessors"].default()]


def test_loading_the_config_imports_neither_the_judge_nor_torch() -> None:
    """Every nbgrader command loads the config: does it start without the judge, torch and
    rfc3987-syntax's parsers (nbformat's jsonschema, pinned below 4.25), so that only
    ``nbgrader autograde`` imports what grading needs?"""
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(REPO)],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert loaded["imported"] == [], loaded
    assert "course.grading.judge.Judge" in loaded["pipeline"]
