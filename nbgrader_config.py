"""nbgrader configuration for the course (nbgrader 0.9.6).

The course root is the directory of this file, so ``nbgrader <cmd>`` works from anywhere
that finds this config, and a copy of the course (tests, CI) is self-contained. Run the
whole instructor workflow with ``make demo``; see autograde/README.md.
"""

import contextlib
import os

c = get_config()  # noqa: F821 - injected by traitlets when it loads this file

c.CourseDirectory.course_id = "sync-data-parallel"
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))

# nbgrader's exchange (release_assignment, fetch, submit, collect, and the formgrader's
# Release and Collect buttons) lives in the course, not in /srv/nbgrader/exchange: it works
# without root, one course per checkout. nbgrader refuses an exchange that does not exist, so
# it is made here (git-ignored). On a JupyterHub (`make hub`) every user shares one
# world-writable folder instead (nbgrader's docs, "Setting up the exchange"), which the hub
# names in $COURSE_EXCHANGE.
c.Exchange.root = os.environ.get("COURSE_EXCHANGE") or os.path.join(
    c.CourseDirectory.root, "exchange"
)
with contextlib.suppress(OSError):  # a read-only copy: nbgrader then says it is missing
    os.makedirs(c.Exchange.root, exist_ok=True)

# The source notebooks are authored as jupytext percent scripts (source/<a>/<a>.py) beside
# the generated .ipynb: release the notebook only, never the script that holds the answers.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.py"]

# Released answer cells stay valid Python (no raise), so "Run all" goes on past an unanswered
# item and every check reports its own clear message instead of a NotImplementedError.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE"}

# Grading an instructor can trust (docs/grading.md, "What grading defends"). No kernel runs the
# submission: course.grading.judge.Judge takes the place of nbgrader's Execute. Quiz answers
# are read from the notebook's text; each code check runs here, its ranks confined
# (course.grading.rankbox: bubblewrap, an unprivileged uid, no network, no course sources),
# and its verdict is computed here from the plain data they send back. Cells that grade
# nothing are not run. Which cells grade, and for how many points, the gradebook says
# (course.grading.cells rebuilds the notebook's nbgrader metadata before nbgrader reads it,
# and a grade cell the student deleted is put back). There is no switch: the tests and
# `make demo` grade this way too. Both pipelines name their preprocessors (strings), so only
# `nbgrader autograde` imports the judge and torch; every other command starts without them.
from course.grading.gradebook import read_schema_here  # noqa: E402 - the config above must not depend on the course
from course.grading.pipelines import autograde_preprocessors, sanitize_preprocessors  # noqa: E402

read_schema_here()  # a new gradebook's schema revision, read here: no `alembic heads` process

c.Autograde.sanitize_preprocessors = sanitize_preprocessors()
c.Autograde.autograde_preprocessors = autograde_preprocessors()

# Student markdown stays inert wherever nbgrader renders it: the feedback page and the
# formgrader's view of a submission (course.grading.inert: no script, no event handler).
c.HTMLExporter.sanitize_html = True
c.HTMLExporter.filters = {"markdown2html": "course.grading.inert.markdown2html"}
# The feedback page as nbgrader makes it, its templates compiled once per process, not once
# a page (course.grading.feedback).
c.GenerateFeedback.exporter_class = "course.grading.feedback.FeedbackExporter"
