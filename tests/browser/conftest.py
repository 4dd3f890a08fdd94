"""Browser fixtures: a real JupyterLab on a free port, driven by Debian's Chromium headless.

    @pytest.mark.browser
    def test_my_notebook(run_notebook, artifact):
        page = run_notebook("demo.ipynb", ["import course", "print(1)"])
        page.screenshot(path=artifact("demo.png"))

``lab`` (one server per session, in a temp root, with a random token, its kernels forked
from the zygote as in the students' lab) yields a :class:`Lab`
(unpacks as ``base_url, token, root_dir``); ``page`` is a fresh Chromium page per test;
``run_notebook`` writes, opens and runs a notebook; ``open_notebook``/``run_all`` do it step by
step with a notebook of your own. Without Chromium the tests are skipped with the
command that installs it. Playwright's own browser downloads are never used.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil
import pytest

from course.instructor.forkedkernels import LAB_OPTION  # kernels forked as in students' labs
from course.instructor.hub import free_ports

CHROMIUM = Path(os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
STDERR = ".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']"
START_TIMEOUT = 60.0
# Quiet JupyterLab: no news or update toasts over the notebook in screenshots.
QUIET_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}

__all__ = [
    "Lab",
    "artifact",
    "open_notebook",
    "run_all",
    "running_lab",
    "stderr_errors",
    "wait_for_figures",
    "wait_for_idle",
    "write_finished",
    "write_notebook",
]


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab: where it answers, its token, and the folder it serves."""

    base_url: str  # ends with "/"
    token: str
    root_dir: Path

    def url(self, path: str = "lab") -> str:
        """A URL of this server with the token, e.g. ``lab.url("lab/tree/demo.ipynb")``."""
        return f"{self.base_url}{path}?token={self.token}"

    def api(self, path: str, method: str = "GET") -> object:
        """Call the server's REST API (``api/kernels``...) and return the decoded JSON."""
        request = urllib.request.Request(  # noqa: S310 - JupyterLab on localhost
            f"{self.base_url}{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310 - JupyterLab on localhost
            body = reply.read()
        return json.loads(body) if body else None

    def __iter__(self) -> Iterator[object]:
        """Unpack as ``base_url, token, root_dir``."""
        return iter((self.base_url, self.token, self.root_dir))


def artifact(name: str) -> Path:
    """A path under ``test-artifacts/`` (git-ignored) for a screenshot or an exported page."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name


@pytest.fixture(name="artifact")
def artifact_fixture():
    """``artifact(name)`` as a fixture: a path under ``test-artifacts/``."""
    return artifact


def write_finished(root: Path, assignment: str) -> str:
    """Write ``assignment``'s release filled in as Ada's sample (the model work: every key,
    every solution) into ``root``; return the file's name."""
    from course.instructor.submissions import assemble, load_specs

    ada = next(s for s in load_specs() if (s.student, s.assignment) == ("ada", assignment))
    release = nbformat.read(REPO / "release" / assignment / f"{assignment}.ipynb", as_version=4)
    source = nbformat.read(REPO / "source" / assignment / f"{assignment}.ipynb", as_version=4)
    name = f"{assignment}-finished.ipynb"
    nbformat.write(assemble(ada, release, source), root / name)
    return name


def stderr_errors(page: object) -> list[str]:
    """The text of every stderr output on the page that names an error."""
    return [t for t in page.locator(STDERR).all_text_contents() if "Error" in t]


def saved_notebook(
    page: object, lab: Lab, path: str, timeout_s: float = 30.0
) -> nbformat.NotebookNode:
    """Save the notebook open in ``page`` (Ctrl+S) and read the file back once the save is
    done: it holds every output, rendered on the page or not. (Jupyter's save copies the
    file to ``.~<name>``, writes the file in place, then removes the copy.)"""
    file = lab.root_dir / path
    copy = file.with_name(f".~{file.name}")
    before = file.stat().st_mtime_ns
    page.locator(".jp-Notebook").first.click()
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + timeout_s
    while file.stat().st_mtime_ns == before or copy.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"JupyterLab did not save {path} in {timeout_s:.0f} s")
        time.sleep(0.05)
    return nbformat.read(file, as_version=4)


def write_notebook(root: Path, name: str, cells: list[str]) -> str:
    """Write a notebook of code cells under the lab's root; return its path relative to it."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, root / name)
    return name


def _quiet_settings(folder: Path) -> None:
    for name, values in QUIET_SETTINGS.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _wait_until_up(lab: Lab, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            lab.api("api/status")
        except OSError:
            time.sleep(0.25)
        else:
            return
    pytest.fail(
        f"jupyter lab did not answer within {START_TIMEOUT:.0f} s:\n{log.read_text()[-3000:]}"
    )


def _stop(lab: Lab, proc: subprocess.Popen) -> None:
    """Shut down every kernel (all at once: each shutdown waits for its kernel), then the
    server; kill whatever of ours is left, by pid."""
    family = []
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
        kernels = [f"api/kernels/{kernel['id']}" for kernel in lab.api("api/kernels")]
        with ThreadPoolExecutor(max_workers=max(len(kernels), 1)) as pool:
            list(pool.map(lambda url: lab.api(url, method="DELETE"), kernels))
    except (OSError, psutil.Error):
        pass
    proc.send_signal(signal.SIGINT)  # jupyter's own clean shutdown (asks twice on a tty)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
    for child in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def _need_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: run `apt-get install -y chromium` (or set COURSE_CHROMIUM "
            "to a Chromium binary) to run the browser tests"
        )


@contextlib.contextmanager
def running_lab(
    root: Path,
    home: Path,
    cwd: Path | None = None,
    command: tuple[list[str], dict[str, str]] | None = None,
) -> Iterator[Lab]:
    """JupyterLab on a free port serving ``root``, with a random token, started in ``cwd``
    (where jupyter looks for an ``nbgrader_config.py``); stopped with everything it started.
    ``command`` is another ``jupyter lab`` command line and environment to start (``make
    lab``'s, say): only the port, the token and no browser are added to it."""
    _need_chromium()
    _quiet_settings(home / "settings")
    port, token = free_ports(1)[0], secrets.token_hex(16)
    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent)) or "jupyter"
    cmd, base = command or (
        [jupyter, "lab", f"--ServerApp.root_dir={root}", LAB_OPTION]
        + (["--allow-root"] if os.geteuid() == 0 else []),
        dict(os.environ),
    )
    env = {
        **base,
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
    }
    log = home / "lab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                *cmd, "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.token={token}", "--ServerApp.port_retries=0",
            ],
            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd or root,
        )  # fmt: skip
    running = Lab(f"http://127.0.0.1:{port}/", token, root)
    try:
        _wait_until_up(running, proc, log)
        yield running
    finally:
        _stop(running, proc)


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """JupyterLab on a free port, serving a temp folder, with a random token."""
    root = tmp_path_factory.mktemp("lab-root")
    with running_lab(root, tmp_path_factory.mktemp("lab-home")) as running:
        yield running


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Debian's Chromium, headless, launched once per session through Playwright."""
    _need_chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """Keep each phase's report on the test item, so ``page`` knows whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@contextlib.contextmanager
def _fresh_page(browser: object, request: pytest.FixtureRequest, name: str) -> Iterator[object]:
    """A page of its own context, 1280 x 1000; a screenshot of it if the test failed."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    context.set_default_timeout(30_000)
    new_page = context.new_page()
    new_page.errors = []  # what the page's scripts threw or logged as errors, for a failure
    new_page.on("pageerror", lambda error: new_page.errors.append(f"uncaught: {error}"))
    new_page.on("console", lambda m: m.type == "error" and new_page.errors.append(m.text))
    yield new_page
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        with contextlib.suppress(Exception):
            new_page.screenshot(path=artifact(f"failed-{name}.png"), full_page=True)
    context.close()


@pytest.fixture
def page(browser: object, request: pytest.FixtureRequest) -> Iterator[object]:
    """A fresh page (own context, 1280 x 1000) for one test; a failing test leaves a
    screenshot in ``test-artifacts/failed-<test>.png``."""
    with _fresh_page(browser, request, request.node.name) as new_page:
        yield new_page


@pytest.fixture
def second_page(browser: object, request: pytest.FixtureRequest) -> Iterator[object]:
    """Another fresh page, for a test that runs two notebooks at a time (one per core)."""
    with _fresh_page(browser, request, f"{request.node.name}-second") as new_page:
        yield new_page


@pytest.fixture(scope="session")
def helpers() -> object:
    """This module, for test files: they cannot import it by name (tests/conftest.py is a
    ``conftest`` too), so they take its helpers (``open_notebook``, ``run_all``...) here."""
    return sys.modules[__name__]


@pytest.fixture
def run_notebook(lab: Lab, page: object):
    """``run_notebook(name, cells)``: write a notebook, open it, run all, return the page."""

    def _run(name: str, cells: list[str], timeout_s: float = 45.0) -> object:
        open_notebook(page, lab, write_notebook(lab.root_dir, name, cells))
        run_all(page, timeout_s)
        return page

    return _run


def open_notebook(page: object, lab: Lab, path: str, timeout_s: float = 60.0) -> None:
    """Open ``path`` (relative to the lab's root) in a workspace of its own (no tab left over
    from another test takes the clicks), and wait until its kernel is up and idle."""
    page.goto(lab.url(f"lab/workspaces/{Path(path).stem}/tree/{path}"))
    page.wait_for_selector(".jp-Notebook .jp-Cell", state="attached")
    deadline = time.monotonic() + timeout_s
    while not _kernel_idle(lab, path):  # the page says "idle" before the kernel even starts
        if time.monotonic() > deadline:
            pytest.fail(f"the kernel of {path} did not start within {timeout_s:.0f} s")
        time.sleep(0.2)
    wait_for_idle(page, timeout_s)


def _kernel_idle(lab: Lab, path: str) -> bool:
    sessions = lab.api("api/sessions")
    return any(
        s["path"] == path and (s.get("kernel") or {}).get("execution_state") == "idle"
        for s in sessions
    )


def run_all(page: object, timeout_s: float = 45.0) -> None:
    """Run > Run All Cells, then wait until the kernel is idle and every code cell has run
    (or one raised: the rest stay unrun, as in JupyterLab)."""
    start_run_all(page)
    wait_for_idle(page, timeout_s, all_run=True)


def _fail_on_a_dialog(page: object) -> None:
    """If a JupyterLab dialog stands over the page, fail saying what it says (and keep a
    screenshot of it), rather than with the click it blocked."""
    dialogs = page.locator(".jp-Dialog")
    if dialogs.count():
        page.screenshot(path=artifact("dialog-over-the-notebook.png"))
        said = " ".join(dialogs.first.inner_text().split())
        raise AssertionError(f"a JupyterLab dialog stands over the notebook: {said[:500]!r}")


def start_run_all(page: object) -> None:
    """Run > Run All Cells, until a cell shows it is queued or running (not waiting for it)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _attempt in range(3):  # a click landing while Lab is still settling can be lost
        try:
            page.locator(".jp-Notebook").first.click(timeout=30_000)
        except PlaywrightTimeout:
            _fail_on_a_dialog(page)
            raise
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        try:
            page.wait_for_function(
                r"""() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                    .some(p => /\[(\*|\d+)\]/.test(p.textContent))""",
                timeout=10_000,
            )
            break
        except PlaywrightTimeout:
            continue  # nothing started: open the menu again


def wait_for_idle(page: object, timeout_s: float = 45.0, all_run: bool = False) -> None:
    """Wait until the kernel reports idle and no cell shows ``[*]`` (queued or running);
    with ``all_run``, also until every code cell shows an execution count or one failed."""
    page.wait_for_function(
        r"""(allRun) => {
            const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
            const idle = status && status.getAttribute('data-status') === 'idle';
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
            const done = p => /\[\d+\]/.test(p.textContent);
            const failed = document.querySelector(
                '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]');
            return idle && !prompts.some(p => p.textContent.includes('*'))
                && (!allRun || prompts.every(done) || failed !== null);
        }""",
        arg=all_run,
        timeout=timeout_s * 1000,
        polling=500,  # not Playwright's default, a poll each frame: Chromium kept drawing frames
    )


def wait_for_figures(page: object, count: int, timeout_s: float = 120.0) -> None:
    """Wait until ``count`` plotly heatmaps are drawn on the page; if they are not, fail saying
    what each output shows (a widget's error, an empty plot) and what the page's scripts
    threw. Polled twice a second: a look each frame kept Chromium drawing frames."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(
            "(n) => document.querySelectorAll('.js-plotly-plot .heatmaplayer').length >= n",
            arg=count,
            timeout=timeout_s * 1000,
            polling=500,
        )
    except PlaywrightTimeout:
        outputs = page.evaluate(
            """() => [...document.querySelectorAll('.jp-OutputArea-output')].map((o, i) =>
                `output ${i}: ${o.querySelectorAll('.js-plotly-plot').length} plot(s), ` +
                `${o.querySelectorAll('.heatmaplayer').length} heatmap(s), ` +
                `text ${JSON.stringify(o.innerText.slice(0, 160))}`)"""
        )
        errors = getattr(page, "errors", [])[-10:]
        raise AssertionError(
            f"fewer than {count} heatmaps drawn in {timeout_s:.0f} s\n"
            + "\n".join(outputs)
            + "\npage errors:\n"
            + ("\n".join(errors) or "(none)")
        ) from None
