"""Tests for the %%ranks cell magic, in an IPython shell and in a real notebook kernel."""

from __future__ import annotations

import nbformat
import pytest
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython
from nbclient import NotebookClient

from course.ranks import RankError

pytestmark = pytest.mark.usefixtures("no_leftovers")


@pytest.fixture(scope="module")
def ip():
    """An IPython shell with the course extension loaded."""
    shell = start_ipython()
    shell.run_cell("%load_ext course")
    return shell


def cell(ip, source: str):
    """Run a cell; return its ExecutionResult."""
    return ip.run_cell(source)


@pytest.mark.ranks
def test_output_grouped_by_rank(ip, capsys: pytest.CaptureFixture[str]) -> None:
    """Does each rank's output come back under its own header, in rank order?"""
    result = cell(ip, "%%ranks 3\nprint('hello')\nprint('from', rank)")
    assert result.success
    out = capsys.readouterr().out
    assert out == "".join(f"[rank {r}]\nhello\nfrom {r}\n" for r in range(3))


@pytest.mark.ranks
def test_one_line_per_rank(ip, capsys: pytest.CaptureFixture[str]) -> None:
    """Is one line per rank shown as one line each, with the last expression's value?"""
    cell(ip, "%%ranks 2\nt = torch.tensor([1.0])\ndist.all_reduce(t)\nt.item() + rank")
    assert capsys.readouterr().out == "[rank 0] 2.0\n[rank 1] 3.0\n"


@pytest.mark.ranks
def test_out_show_and_quiet(ip, capsys: pytest.CaptureFixture[str]) -> None:
    """Do --out, --show and --quiet store values and pick whose output is shown?"""
    cell(ip, "%%ranks 3 --out vals --show 0,2\nprint(rank)\nrank * 10")
    assert capsys.readouterr().out == "[rank 0]\n0\n0\n[rank 2]\n2\n20\n"
    assert ip.user_ns["vals"] == [0, 10, 20]
    cell(ip, "%%ranks 2 -q\nprint(rank)")
    assert capsys.readouterr().out == ""


@pytest.mark.ranks
def test_notebook_variables_are_sent(ip, capsys: pytest.CaptureFixture[str]) -> None:
    """Can the cell use functions and variables defined in earlier cells?"""
    cell(ip, "def twice(x):\n    return 2 * x\nbase, timeout = 100, 1")
    cell(ip, "import threading\nlk = threading.Lock()")
    own_lk = "lk = None  # the cell's own lk: the notebook's is not sent"
    cell(ip, f"%%ranks 2\n{own_lk}\nbase + twice(rank) + timeout")
    assert capsys.readouterr().out == "[rank 0] 101\n[rank 1] 103\n"


@pytest.mark.ranks
def test_rank_error_shows_user_traceback(ip, capsys: pytest.CaptureFixture[str]) -> None:
    """Does a failing rank fail the cell with its own traceback, not the launcher's frames?"""
    source = "%%ranks 2\nx = torch.zeros(1)\nif rank == 1:\n    raise ValueError('bad')\n"
    source += "dist.recv(x, src=1)"
    result = cell(ip, source)
    assert isinstance(result.error_in_exec, RankError)
    shown = "\n".join(result.error_in_exec._render_traceback_())
    assert "rank 1 raised ValueError: bad at <cell> line 4" in shown  # as the cell shows it
    assert "raise ValueError('bad')" in shown and "ranks.py" not in shown
    assert "rank 0 was blocked in dist.recv at <cell> line 5" in shown
    assert cell(ip, "%%ranks 2\nrank").success  # the next cell still works
    capsys.readouterr()


@pytest.mark.ranks
def test_a_native_abort_reads_as_one_line_and_its_hint(
    ip, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ring step whose receive is one element short makes gloo abort the receiver in C++:
    does the cell show one line for it, in bytes, with the hint for its cause, and none of
    the C++ runtime's words, faulthandler's dump or the course's frames?"""
    source = "%%ranks 3\nright, left = (rank + 1) % world_size, (rank - 1) % world_size\n"
    source += "print('before', rank)\nsend = dist.isend(torch.ones(3), right)\n"
    source += "dist.recv(torch.empty(2 if rank == 1 else 3), left)\nsend.wait()\n"
    result = cell(ip, source)
    shown = "\n".join(result.error_in_exec._render_traceback_())
    said = capsys.readouterr()
    everything = shown + said.out + said.err
    killed = "rank 1 was killed by SIGABRT: gloo aborted it: a message of 12 bytes arrived"
    assert f"{killed} for a receive of 8 bytes" in shown
    assert "does not fit the buffer posted to receive it" in shown
    assert "before 1" in said.out  # what the rank printed before it died is kept
    for internal in ("terminate called", "Fatal Python error", "Extension modules", "course/"):
        assert internal not in everything


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("%%ranks", "world_size"),
        ("%%ranks two", "invalid int value"),
        ("%%ranks 0", "at least 1"),
        ("%%ranks 2 --timeout -1", "timeout"),
        ("%%ranks 2 --show 7", "ranks go from 0 to 1"),
        ("%%ranks 2 --bogus", "unrecognized arguments"),
    ],
)
def test_bad_magic_line(ip, line: str, message: str) -> None:
    """Does a magic line that does not parse give a one-line usage error?"""
    result = cell(ip, f"{line}\nprint(rank)")
    assert isinstance(result.error_in_exec, UsageError)
    assert message in str(result.error_in_exec)


def test_bad_cell_and_unsendable_variable(ip) -> None:
    """Are a syntax error and an unpicklable variable reported before any rank starts?"""
    result = cell(ip, "%%ranks 2\nfor")
    assert "not valid Python" in str(result.error_in_exec)
    cell(ip, "import threading\nlock = threading.Lock()")
    result = cell(ip, "%%ranks 2\nprint(lock)")
    assert "variable 'lock' (a lock) cannot be sent to the ranks" in str(result.error_in_exec)


@pytest.mark.ranks
@pytest.mark.slow
def test_notebook_through_nbclient() -> None:
    """Does a notebook using %%ranks run under nbclient (as nbgrader runs it), errors included?"""
    nb = nbformat.v4.new_notebook()
    sources = [
        "%load_ext course",
        "%%ranks 2\nt = torch.tensor([float(rank)])\ndist.all_reduce(t)\nprint(t.item())",
        "def half(x):\n    return x / 2",
        "%%ranks 2 --timeout 20\nx = torch.zeros(1)\nif rank == 1:\n    1 / 0\ndist.recv(x, src=1)",
        "%%ranks 2 --out vals\nhalf(rank)",
        "print(vals)",
    ]
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()
    outputs = [c.outputs for c in nb.cells]
    assert outputs[1][0]["text"] == "[rank 0] 1.0\n[rank 1] 1.0\n"
    error = outputs[3][-1]
    assert error["output_type"] == "error" and error["ename"] == "RankError"
    shown = "\n".join(error["traceback"])
    assert "ZeroDivisionError: division by zero" in shown and "1 / 0" in shown
    assert "course/" not in shown and "interactiveshell" not in shown
    assert outputs[5][0]["text"] == "[0.0, 0.5]\n"
