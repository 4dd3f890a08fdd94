"""The ZeRO experiments' own parts: bytes held, the inner optimizers, the one-process oracle."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course.lessons.zero import experiment as zero


def _one_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    nn.functional.mse_loss(model(torch.randn(4, 64)), torch.randn(4, 64)).backward()
    optimizer.step()


def test_memory_breakdown_of_plain_adam_is_4_4_8() -> None:
    """Does a full Adam hold 4 bytes of parameters, 4 of gradient and 8 of state per parameter?"""
    model = zero.toy_model(depth=2)
    optimizer = torch.optim.Adam(model.parameters())
    _one_step(model, optimizer)
    psi = sum(p.numel() for p in model.parameters())
    held = zero.memory_breakdown(model, optimizer)
    assert held["params"] == held["grads"] == 4 * psi
    assert 8 * psi <= held["state"] <= 8 * psi + 64  # plus a step counter per parameter


def test_inner_optimizers_found_in_a_wrapper() -> None:
    """Is the torch optimizer a wrapper keeps (under any attribute name) the one counted?"""

    class Wrapper:
        def __init__(self, params) -> None:
            self.parts = {"inner": torch.optim.SGD(params, lr=0.1, momentum=0.9)}

    model = zero.toy_model(depth=1)
    wrapper = Wrapper(model.parameters())
    assert zero.inner_optimizers(wrapper) == [wrapper.parts["inner"]]


@pytest.mark.ranks
def test_single_process_oracle_is_ddp(run_ranks) -> None:
    """Does the one-process oracle give DDP + Adam's parameters (bit for bit on 2 ranks)?"""
    ddp = run_ranks(zero.final_params, 2, "DDP", None, 3, 5, timeout=60)[0]
    assert torch.equal(ddp, zero.single_process_params(2, 3, 5))


class _FreeingAdam(torch.optim.Adam):
    """Adam that frees each gradient as soon as it has arrived, in a hook of its own: a
    gradient that is never held by the time backward ends."""

    def __init__(self, params, _optimizer_class=None, **defaults) -> None:
        params = list(params)
        super().__init__(params, **defaults)
        for p in params:
            p.register_post_accumulate_grad_hook(self._free)

    @staticmethod
    def _free(p: torch.Tensor) -> None:
        p.grad = None


@pytest.mark.ranks
def test_memory_during_backward_counts_before_the_optimizers_own_hooks(run_ranks) -> None:
    """Does the count at each gradient's arrival see that gradient before a hook the optimizer
    registered frees it (one layer of 12 at most), and every gradient under DDP?"""
    psi = sum(p.numel() for p in zero.toy_model().parameters())
    freed = run_ranks(zero.memory_during_backward, 2, "zero", _FreeingAdam, timeout=60)[0]
    assert freed["grads"] == 4 * psi // 12  # one layer's gradient, counted before it goes
    ddp = run_ranks(zero.memory_during_backward, 2, "DDP", timeout=60)[0]
    assert ddp["grads"] == 4 * psi and ddp["params"] == 4 * psi


def test_reports_measure_nothing_while_nbgrader_runs(monkeypatch, capsys) -> None:
    """Under autograde, do the measuring cells skip (saying so) instead of starting ranks?"""
    from course.lessons.zero import report as zero_report

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setattr(zero_report, "run", None)  # any launch would fail
    zero_report.report_memory(object(), when=("after backward", "during backward"))
    zero_report.report_powersgd()
    zero_report.report_torch_zero([(2, [10, 10])])
    assert zero_report.memory_figure(object()) is None
    assert capsys.readouterr().out.count("measurement skipped") == 4
