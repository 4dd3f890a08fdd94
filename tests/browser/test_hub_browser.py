"""A term on a real JupyterHub, in Chromium: release, fetch, submit, collect, grade, feedback.

The class (course.instructor.hub) runs on loopback with PAM logins of real Unix accounts made
for it: an instructor, three students (a right ring, a deadlocking ring, a hostile one that
answers wrong and tries to read the keys and other students' work), and the grader account
that runs formgrader as a hub service. The instructor releases and collects in formgrader;
``make autograde`` grades as root; formgrader generates and releases the feedback; each
student fetches it in JupyterLab's assignment list. Screenshots go to test-artifacts/hub-*.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from course.grading.gradebook import open_gradebook
from course.instructor import hub, hubdown
from course.instructor.submissions import Submission, assemble, load_specs

pytestmark = [
    pytest.mark.browser,
    pytest.mark.nbgrader,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
]

REPO = Path(__file__).resolve().parents[2]
RING = "ring_allreduce"
NOTEBOOK = f"{RING}/{RING}.ipynb"
COURSE = hub.COURSE_ID
# What the hostile student adds to every answer cell: it answers wrong, then tries to read
# the keys from the instructor's sources and the other students' work (its kernel's uid).
SNOOP = """
import glob
for _path in glob.glob("/srv/*/course/source/*/*.ipynb") + glob.glob("/home/*/ring_allreduce/*"):
    print(open(_path).read()[:100])
"""


def _needs() -> None:
    if os.geteuid() != 0:
        pytest.skip("a hub with real Unix accounts needs root (useradd, PAM, spawning as users)")
    if not hub.PROXY.exists():
        pytest.skip(f"no configurable-http-proxy at {hub.PROXY}: run `make setup` (npm ci)")
    for tool in ("useradd", "chpasswd", "getent"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is missing: accounts cannot be made")


@pytest.fixture(scope="module")
def cls() -> Iterator[hub.Class]:
    """The class, set up from scratch (its accounts removed afterwards), with its hub running."""
    _needs()
    port, *ports = hub.free_ports(4)
    users = ("hubt-teach", "hubt-ada", "hubt-cy", "hubt-eve")
    the_class = hub.Class(
        root=Path("/srv/sync-data-parallel-test"),
        env=Path("/opt/sync-data-parallel/test-env"),
        instructor=users[0], students=users[1:], prefix="hubt", port=port,
        ports=tuple(ports), passwords={u: f"pw-{u}-{port}" for u in users},
    )  # fmt: skip
    shutil.rmtree(the_class.root, ignore_errors=True)
    hub.remove_accounts(the_class)  # a run that died left them: start from none
    hub.set_up(the_class)
    log = (the_class.root / "hub" / "hub.log").open("w")
    proc = subprocess.Popen(hub.hub_command(the_class), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        _wait_for(the_class, proc)
        yield the_class
    finally:
        hubdown.stop_hub(the_class, wait=30)  # if the last test did not
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)  # nothing of a hub that would not stop
        proc.wait()
        hubdown.remove_class(the_class)


def _wait_for(the_class: hub.Class, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyterhub exited: {_log(the_class)}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{the_class.url}hub/api", timeout=5)  # noqa: S310 - our hub on loopback
            return
        time.sleep(0.5)
    pytest.fail(f"jupyterhub did not answer in 120 s: {_log(the_class)}")


def _log(the_class: hub.Class) -> str:
    return (the_class.root / "hub" / "hub.log").read_text()[-4000:]


def login(browser: object, the_class: hub.Class, user: str) -> object:
    """A page of a fresh browser context, logged in to the hub as ``user``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.goto(f"{the_class.url}hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", the_class.passwords[user])
    page.click("#login_submit")
    page.wait_for_url(lambda url: "/hub/login" not in url)
    return page


def formgrader_click(page: object, the_class: hub.Class, column: str, done: str) -> None:
    """Click ``column``'s link in the ring's row of Manage Assignments; wait for ``done``."""
    page.goto(f"{the_class.url}services/{COURSE}/formgrader/manage_assignments")
    row = page.locator("tr", has=page.locator("td.name", has_text=RING))
    row.locator(f"td.{column} a").click()
    page.wait_for_selector(f"text={done}", timeout=120_000)
    page.locator(".modal-footer button").first.click()


def open_lab(page: object, the_class: hub.Class, user: str) -> None:
    """The user's JupyterLab, spawned by the hub (the first time takes a while)."""
    page.goto(f"{the_class.url}user/{user}/lab")
    page.wait_for_selector("#jp-menu-panel", timeout=180_000)


def assignment_list(page: object) -> None:
    """Nbgrader > Assignment List, refreshed."""
    page.locator('#jp-menu-panel div.lm-MenuBar-itemLabel:text("Nbgrader")').click()
    page.locator('li[data-command="nbgrader:open-assignment-list"]').click()
    page.wait_for_selector("#released_assignments_list")
    page.locator("#refresh_assignments_list").click()


def put_notebook(page: object, user: str, path: str, nb: dict) -> None:
    """Save ``nb`` at ``path`` through the user's own Jupyter server, as the page would."""
    status = page.evaluate(
        """async ([user, path, nb]) => {
            const xsrf = (document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || "";
            const reply = await fetch(`/user/${user}/api/contents/${path}`, {
                method: "PUT",
                headers: {"Content-Type": "application/json", "X-XSRFToken": xsrf},
                body: JSON.stringify({type: "notebook", format: "json", content: nb}),
            });
            return reply.status;
        }""",
        [user, path, nb],
    )
    assert status in (200, 201), status


def submission_of(student: str) -> dict:
    """The student's notebook, assembled onto the release from the sample specs."""
    kind = {"hubt-ada": "ada", "hubt-cy": "cy"}.get(student)
    specs = {s.student: s for s in load_specs(REPO / "autograde" / "submissions")
             if s.assignment == RING}  # fmt: skip
    sub = specs[kind] if kind else Submission(student, RING, answers={"*": "wrong"})
    release = nbformat.read(REPO / "release" / RING / f"{RING}.ipynb", as_version=4)
    source = nbformat.read(REPO / "source" / RING / f"{RING}.ipynb", as_version=4)
    nb = assemble(sub, release, source)
    if not kind:
        for cell in nb.cells:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "").endswith("_answer"):
                cell.source += "\n" + SNOOP
    return json.loads(nbformat.writes(nb))


def _shot(page: object, artifact: object, name: str) -> None:
    page.screenshot(path=artifact(f"hub-{name}.png"))


@pytest.fixture(scope="module")
def term(cls: hub.Class, browser: object, helpers: object) -> dict:
    """The whole term, driven in the browser; what each student saw at the end."""
    artifact = helpers.artifact
    started = time.monotonic()
    teacher = login(browser, cls, cls.instructor)
    formgrader_click(teacher, cls, "release", "Successfully released")
    _shot(teacher, artifact, "1-released")
    for student in cls.students:
        page = login(browser, cls, student)
        open_lab(page, cls, student)
        assignment_list(page)
        page.locator("#released_assignments_list .list_item .item_status button").first.click()
        page.wait_for_selector("#fetched_assignments_list .list_item .item_status button")
        put_notebook(page, student, NOTEBOOK, submission_of(student))
        _shot(page, artifact, f"2-fetched-{student}")
        page.locator('#fetched_assignments_list .item_status button:text("Submit")').first.click()
        page.wait_for_selector("#submitted_assignments_list .list_item .item_name")
        _shot(page, artifact, f"3-submitted-{student}")
        page.context.close()
    formgrader_click(teacher, cls, "collect", "Successfully collected")
    graded = subprocess.run(["make", "-C", str(REPO), "autograde", f"ROOT={cls.course}"],
                            capture_output=True, text=True, check=False)  # fmt: skip
    formgrader_click(teacher, cls, "generate-feedback", "Successfully generated feedback")
    formgrader_click(teacher, cls, "release-feedback", "Successfully released feedback")
    _shot(teacher, artifact, "4-feedback-released")
    teacher.context.close()
    seen = {}
    for student in cls.students:
        page = login(browser, cls, student)
        open_lab(page, cls, student)
        assignment_list(page)
        page.locator('#submitted_assignments_list button:text("Fetch Feedback")').first.click()
        page.wait_for_selector("#submitted_assignments_list a:text('view feedback')")
        feedback = next(Path(f"/home/{student}/{RING}/feedback").glob(f"*/{RING}.html"))
        page.goto(
            f"{cls.url}user/{student}/files/{RING}/feedback/{feedback.parent.name}/{RING}.html"
        )
        page.wait_for_selector("text=ring_allreduce")
        page.locator("a:text('Test cell')").nth(3).click()  # the ring's sums: its message
        _shot(page, artifact, f"5-feedback-{student}")
        seen[student] = page.inner_text("body")
        page.context.close()
    return {"graded": graded, "seen": seen, "seconds": time.monotonic() - started}


def _scores(root: Path) -> dict[str, float]:
    with open_gradebook(root / "gradebook.db") as gb:
        return {s.student_id: float(s.score) for s in gb.assignment_submissions(RING)}


def test_a_term_on_the_hub_grades_every_student_as_their_work_deserves(cls, term) -> None:
    """Released, fetched, submitted, collected and graded through the hub: is the right ring
    full marks, the deadlocking ring its quiz points only, the hostile one nothing it did not
    earn, with `make autograde` finished cleanly?"""
    print(f"the term took {term['seconds']:.0f} s")
    assert term["graded"].returncode == 0, term["graded"].stdout[-3000:] + term["graded"].stderr
    scores = _scores(cls.course)
    assert scores["hubt-ada"] == 16
    assert scores["hubt-cy"] == 6  # the quiz items: the ring deadlocks
    assert scores["hubt-eve"] == 10  # wrong letters; its own (model) ring earns the ring's points


def test_each_student_reads_their_own_teaching_messages(term) -> None:
    """Does each student's fetched feedback carry their own one-line teaching messages?"""
    seen = term["seen"]
    assert f"{RING} (Score: 16.0 / 16.0)" in seen["hubt-ada"]
    assert f"{RING} (Score: 6.0 / 16.0)" in seen["hubt-cy"]
    assert f"{RING} (Score: 10.0 / 16.0)" in seen["hubt-eve"]
    assert "rank 0 deadlocked in dist.recv at <cell ring_allreduce>" in seen["hubt-cy"]
    assert "deadlocked" not in seen["hubt-ada"] + seen["hubt-eve"]


PROBE = """
import os
tries = {
    "another student's fetched notebook": "/home/hubt-ada/ring_allreduce/ring_allreduce.ipynb",
    "another student's feedback": "/home/hubt-ada/ring_allreduce/feedback",
    "the exchange's submissions": "EXCHANGE/sync-data-parallel/inbound",
    "the exchange's feedback": "EXCHANGE/sync-data-parallel/feedback",
    "the instructor's source": "COURSE/source/ring_allreduce/ring_allreduce.ipynb",
    "the gradebook": "COURSE/gradebook.db",
}
for what, path in tries.items():
    try:
        os.listdir(path) if os.path.isdir(path) else open(path, "rb").read(1)
        print("READ:", what)
    except PermissionError:
        print("refused:", what)
try:
    import course.instructor.reference
    print("READ: the reference ring")
except (ImportError, PermissionError):
    print("refused: the reference ring")
print("PROBE DONE")
"""


def test_a_student_can_read_no_one_elses_work_nor_the_instructors(cls, term, browser, helpers):
    """Tried from a student's own kernel and browser: is every other student's work, the
    exchange's submissions and feedback, the sources, the gradebook and the reference ring
    refused, and another student's server too?"""
    student = "hubt-cy"
    page = login(browser, cls, student)
    open_lab(page, cls, student)
    probe = PROBE.replace("EXCHANGE", str(cls.exchange)).replace("COURSE", str(cls.course))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(probe)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    put_notebook(page, student, "probe.ipynb", json.loads(nbformat.writes(nb)))
    page.goto(f"{cls.url}user/{student}/lab/tree/probe.ipynb")
    page.wait_for_selector(".jp-Notebook .jp-Cell")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    helpers.start_run_all(page)  # clicks again if the first lands while the lab settles
    # In the output: the cell's own source says PROBE DONE from the start.
    done = page.locator(".jp-OutputArea-output", has_text="PROBE DONE").first
    done.wait_for(timeout=240_000)
    out = done.inner_text()
    page.screenshot(path=helpers.artifact("hub-6-isolation.png"))
    assert "READ:" not in out, out
    assert out.count("refused:") == 7, out
    other = page.goto(f"{cls.url}user/hubt-ada/lab")
    assert other.status == 403 or "403" in page.content()
    page.screenshot(path=helpers.artifact("hub-7-another-server.png"))
    page.context.close()


def test_formgrader_opens_in_jupyterlab_under_the_hub(cls, term, browser, helpers):
    """In the course service's JupyterLab, does Nbgrader > Formgrader show formgrader's page
    in its frame (the Content-Security-Policy lets a server frame its own pages)?"""
    page = login(browser, cls, cls.instructor)
    page.goto(f"{cls.url}services/{COURSE}/lab")
    page.wait_for_selector("#jp-menu-panel", timeout=120_000)
    page.locator('#jp-menu-panel div.lm-MenuBar-itemLabel:text("Nbgrader")').click()
    page.locator('li[data-command="nbgrader:open-formgrader"]').click()
    frame = page.frame_locator("iframe").first
    frame.locator("text=Manage Assignments").first.wait_for(timeout=60_000)
    frame.locator(f"td.name:has-text('{RING}')").wait_for(timeout=60_000)
    page.screenshot(path=helpers.artifact("hub-8-formgrader-iframe.png"))
    page.context.close()


def test_a_student_on_the_hub_gets_the_student_lab(cls, term, browser, helpers):
    """As a student on the hub: is the Nbgrader menu down to the assignment list, with no
    Create Assignment sidebar, formgrader's page and API not served by the student's server,
    and the course service's formgrader refused?"""
    student = "hubt-ada"
    page = login(browser, cls, student)
    open_lab(page, cls, student)
    page.locator('#jp-menu-panel div.lm-MenuBar-itemLabel:text("Nbgrader")').click()
    items = page.locator(".lm-Menu-content .lm-Menu-itemLabel").all_text_contents()
    assert [i for i in items if i] == ["Assignment List"]
    assert page.get_by_text("Create Assignment").count() == 0
    page.screenshot(path=helpers.artifact("hub-9-student-menu.png"))
    page.keyboard.press("Escape")
    for path in ("formgrader", "formgrader/api/assignments"):
        seen = page.goto(f"{cls.url}user/{student}/{path}")
        assert seen.status == 404, (path, seen.status)
    service = page.goto(f"{cls.url}services/{COURSE}/formgrader")
    assert service.status == 403 or "403" in page.content()
    page.context.close()


def test_make_hub_down_stops_the_hub_by_itself_without_a_traceback(cls, term) -> None:
    """Last: does stopping the hub as `make hub-down` does (SIGTERM, found by its pid file)
    end it by itself, its users' servers and service with it, and log no traceback?"""
    logged = len(_log_all(cls))
    how, took = hubdown.stop_hub(cls, wait=60)
    print(f"the hub {how} in {took:.1f} s")
    assert how == "stopped", (how, took)
    after = _log_all(cls)[logged:]
    assert "Traceback" not in after, after[-3000:]
    left = _processes_of((*cls.users, cls.grader), within=10.0)  # the servers end as the hub does
    assert not left, left


def _processes_of(users: tuple[str, ...], within: float) -> dict[str, str]:
    """The processes each user still runs once ``within`` seconds have passed or none is left."""
    deadline = time.monotonic() + within
    while True:
        pgrep = [
            subprocess.run(["pgrep", "-a", "-u", u], capture_output=True, text=True, check=False)
            for u in users
        ]
        left = {u: p.stdout for u, p in zip(users, pgrep, strict=True) if p.stdout}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _log_all(the_class: hub.Class) -> str:
    return (the_class.root / "hub" / "hub.log").read_text()
