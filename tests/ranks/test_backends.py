"""Ranks on GPUs (nccl) where there are GPUs, and the same experiment code under torchrun."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from course.ranks import run, run_source

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _device_of_rank() -> str:
    import torch.distributed as dist

    t = torch.ones(1, device=f"cuda:{dist.get_rank()}")
    dist.all_reduce(t)
    return f"{t.device} {t.item():g} {dist.get_backend()}"


@pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA devices; this machine has {GPUS}")
@pytest.mark.ranks
def test_nccl_puts_rank_r_on_cuda_r() -> None:
    """With backend='nccl', does rank r all-reduce on cuda:r?"""
    assert run(_device_of_rank, 2, backend="nccl") == ["cuda:0 2 nccl", "cuda:1 2 nccl"]


@pytest.mark.skipif(GPUS >= 64, reason="every world size fits")
def test_nccl_without_enough_gpus_is_refused_before_any_rank_starts() -> None:
    """Does asking nccl for more ranks than GPUs say why, and what to do instead?"""
    with pytest.raises(ValueError, match=r"need \d+ CUDA devices; this machine has") as info:
        run_source("pass", GPUS + 1, backend="nccl")
    assert "backend='gloo'" in str(info.value)


def test_an_unknown_backend_is_refused() -> None:
    """Does a misspelt backend name fail at once with the choices?"""
    with pytest.raises(ValueError, match=r"'gloo' \(CPU\), 'relay' .* or 'nccl'"):
        run_source("pass", 2, backend="mpi")


@pytest.mark.ranks
def test_cells_see_their_device() -> None:
    """Is `device` defined on every rank of a gloo run, as the CPU?"""
    assert run_source("str(device)", 2) == ["cpu", "cpu"]


@pytest.mark.ranks
@pytest.mark.slow
def test_a_course_experiment_runs_under_torchrun() -> None:
    """Does `torchrun --nproc-per-node 2 -m course.lessons.ddp_gradients.experiment` give both
    ranks the mean?"""
    # One host: gloo on loopback, as the launcher's own ranks use (a hostname that resolves
    # to another interface can make gloo abort while it connects).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    out = subprocess.run(
        [*cmd, "-m", "course.lessons.ddp_gradients.experiment"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-6000:]
    # each rank prints its seed_step() dict; the two prints may share a line
    grads = dict(re.findall(r"'rank': (\d+), .*?'grad': (\[[^\]]*\])", out.stdout))
    assert grads == {"0": "[1.5, 1.5]", "1": "[1.5, 1.5]"}, out.stdout
