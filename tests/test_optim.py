"""Both parties' optimiser (common/optim.py): fused, the same update rule as torch's loop, and a
checkpoint of either kind restores."""

import io

import pytest
import torch

from vesper.common.config import OptimizerConfig
from vesper.common.optim import build_optimizer


def _parameters(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in ((64, 33), (64,), (7, 64), ())]


def _train(optimizer: torch.optim.Optimizer, parameters: list[torch.nn.Parameter], steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for parameter in parameters:
            parameter.grad = torch.randn(parameter.shape, generator=generator)
        optimizer.step()


@pytest.mark.parametrize("name, weight_decay", [("adam", 0.0), ("adam", 0.01), ("sgd", 0.01)])
def test_fused_follows_the_same_rule_as_torchs_loop(name: str, weight_decay: float) -> None:
    config = OptimizerConfig(name=name, lr=0.01, weight_decay=weight_decay)
    ours, loop = _parameters(0), _parameters(0)
    optimizer = build_optimizer(config, ours)
    assert optimizer.param_groups[0]["fused"] is True
    reference_class = torch.optim.Adam if name == "adam" else torch.optim.SGD
    reference = reference_class(loop, lr=0.01, weight_decay=weight_decay, foreach=False)
    _train(optimizer, ours, 50, seed=1)
    _train(reference, loop, 50, seed=1)
    for mine, theirs, start in zip(ours, loop, _parameters(0), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
        assert (mine - start).abs().max() > 1e-3  # it trained


def test_a_checkpoint_of_the_loop_optimiser_restores_into_a_fused_one_and_goes_on() -> None:
    """A run checkpointed before the optimiser was fused resumes with the setting it was saved
    with (the saved param_groups), and its moments go on."""
    loop_parameters = _parameters(0)
    loop = torch.optim.Adam(loop_parameters, lr=0.01)
    _train(loop, loop_parameters, 5, seed=1)
    resumed_parameters = [torch.nn.Parameter(p.detach().clone()) for p in loop_parameters]
    resumed = build_optimizer(OptimizerConfig(), resumed_parameters)
    saved = io.BytesIO()
    torch.save(loop.state_dict(), saved)  # as a checkpoint holds it: a copy, not the live moments
    saved.seek(0)
    resumed.load_state_dict(torch.load(saved))
    assert resumed.param_groups[0]["fused"] is None  # as saved
    _train(loop, loop_parameters, 5, seed=2)
    _train(resumed, resumed_parameters, 5, seed=2)
    for mine, theirs in zip(resumed_parameters, loop_parameters, strict=True):
        assert torch.equal(mine, theirs)


def test_a_torch_that_refuses_fused_gets_its_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """As torch before 2.4 does for CPU parameters: ``fused=True`` refused when the optimiser is built."""
    built = []

    class OldAdam(torch.optim.Adam):
        def __init__(self, params, **options) -> None:
            if options.get("fused"):
                raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices: ['cuda']")
            built.append(options)
            super().__init__(params, **options)

    monkeypatch.setattr(torch.optim, "Adam", OldAdam)
    parameters = (p for p in _parameters(0))  # a generator, as module.parameters() is: read once
    optimizer = build_optimizer(OptimizerConfig(lr=0.02), parameters)
    assert isinstance(optimizer, OldAdam) and built == [{"lr": 0.02, "weight_decay": 0.0}]
    assert len(optimizer.param_groups[0]["params"]) == 4 and not optimizer.param_groups[0]["fused"]
