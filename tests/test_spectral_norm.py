"""party_a.extractors.spectral_norm is torch's spectral normalisation with a hand-written
gradient: the same state, the same values, the same gradients (to rounding)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm as torch_spectral_norm

from vesper.party_a.extractors.spectral_norm import _DivideBySigmas, spectral_norm


def _pair(seed: int, rows: int = 64, cols: int = 64) -> tuple[nn.Linear, nn.Linear]:
    torch.manual_seed(seed)
    ours = spectral_norm(nn.Linear(cols, rows))
    torch.manual_seed(seed)
    reference = torch_spectral_norm(nn.Linear(cols, rows))
    return ours, reference


def test_the_same_state_from_the_same_draws() -> None:
    ours, reference = _pair(0)
    a, b = ours.state_dict(), reference.state_dict()
    assert list(a) == list(b)  # parametrizations.weight.original, ...0._u, ...0._v, bias
    for key in a:
        assert torch.equal(a[key], b[key]), key
    ours.load_state_dict(b)  # checkpoints made with torch's parametrization load as they are


def test_training_steps_give_the_same_weights_and_gradients() -> None:
    for seed, (rows, cols) in enumerate([(64, 64), (32, 96), (96, 16)]):
        ours, reference = _pair(seed, rows, cols)
        x = torch.rand(50, cols, generator=torch.Generator().manual_seed(seed))
        optimisers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (ours, reference)]
        for step in range(6):
            for model, optimiser in zip((ours, reference), optimisers):
                model.train(step % 3 != 2)  # eval steps take no power step
                optimiser.zero_grad()
                out = torch.relu(model(x))
                (out.square().sum() + out[:, 0].sum()).backward()
            torch.testing.assert_close(ours.weight, reference.weight, rtol=1e-5, atol=1e-6)
            g_ours = ours.parametrizations.weight.original.grad
            g_ref = reference.parametrizations.weight.original.grad
            torch.testing.assert_close(g_ours, g_ref, rtol=1e-4, atol=1e-6)
            for optimiser in optimisers:
                optimiser.step()
        torch.testing.assert_close(ours.parametrizations.weight[0]._u, reference.parametrizations.weight[0]._u)


def test_gradient_is_exact_in_float64() -> None:
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(7, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    u = torch.nn.functional.normalize(torch.randn(7, dtype=torch.float64, generator=generator), dim=0)
    v = torch.nn.functional.normalize(torch.randn(5, dtype=torch.float64, generator=generator), dim=0)
    assert torch.autograd.gradcheck(lambda w: _DivideBySigmas.apply(u[None], v[None], w)[0], (weight,))


def test_spectral_norm_of_the_result_is_one_after_power_steps() -> None:
    torch.manual_seed(5)
    layer = spectral_norm(nn.Linear(64, 64))
    for _ in range(30):
        weight = layer.weight
    assert abs(float(torch.linalg.matrix_norm(weight.detach(), ord=2)) - 1.0) < 1e-3


def test_normalised_together_equals_one_by_one() -> None:
    """normalised_weights (one batched power step and division) against each module's own
    forward, over training steps: the same weights, buffers and gradients."""
    from vesper.party_a.extractors.spectral_norm import normalised_weights

    def modules(seed: int) -> list[nn.Linear]:
        torch.manual_seed(seed)
        return [spectral_norm(nn.Linear(16, 16)) for _ in range(4)]

    together, alone = modules(7), modules(7)
    x = torch.rand(9, 16, generator=torch.Generator().manual_seed(1))
    for step in range(5):
        for group in (together, alone):
            for m in group:
                m.train(step != 3)
                m.zero_grad()
        weights_together = normalised_weights(together)
        weights_alone = [m.weight for m in alone]
        for weights in (weights_together, weights_alone):
            sum(torch.relu(x @ w.t()).square().sum() * (i + 1) for i, w in enumerate(weights[:3])).backward()
        for a, b, wa, wb in zip(together, alone, weights_together, weights_alone):
            torch.testing.assert_close(wa, wb, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(a.parametrizations.weight[0]._u, b.parametrizations.weight[0]._u)
            torch.testing.assert_close(a.parametrizations.weight[0]._v, b.parametrizations.weight[0]._v)
            ga, gb = a.parametrizations.weight.original.grad, b.parametrizations.weight.original.grad
            assert (ga is None) == (gb is None)
            if ga is not None:
                torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-6)
        with torch.no_grad():
            for a, b in zip(together[:3], alone[:3]):
                a.parametrizations.weight.original.sub_(0.3 * a.parametrizations.weight.original.grad)
                b.parametrizations.weight.original.sub_(0.3 * b.parametrizations.weight.original.grad)
    assert together[3].parametrizations.weight.original.grad is None  # unused: no gradient, not zeros


def test_mixed_or_plain_modules_are_read_one_by_one() -> None:
    from vesper.party_a.extractors.spectral_norm import normalised_weights

    plain = nn.Linear(8, 8)
    normed = spectral_norm(nn.Linear(8, 8))
    weights = normalised_weights([plain, normed])
    assert weights[0] is plain.weight
    torch.testing.assert_close(weights[1], normed.weight)


def test_pmp_step_weights_equal_each_layers_weights() -> None:
    from vesper.common.config import ExtractorConfig
    from vesper.party_a.extractors.pmp import PmpExtractor

    for name in ("pmp-gcn", "pmp-gin"):
        torch.manual_seed(0)
        a = PmpExtractor(ExtractorConfig(name=name, layers=2, dim=16), 5, torch.ones(4, dtype=torch.int64))
        torch.manual_seed(0)
        b = PmpExtractor(ExtractorConfig(name=name, layers=2, dim=16), 5, torch.ones(4, dtype=torch.int64))
        a.eval(), b.eval()  # no power step: both read the same buffers
        for wa, layer in zip(a.step_weights(), b.layers):
            wb = layer.weights()
            torch.testing.assert_close(wa.self_weight, wb.self_weight)
            torch.testing.assert_close(wa.agg_weight, wb.agg_weight)
            assert wa.self_bias is not None and torch.equal(wa.self_bias, wb.self_bias)
