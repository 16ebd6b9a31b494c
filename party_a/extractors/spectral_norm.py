"""Spectral normalisation of PMP's weights, W / σ(W), with a hand-written gradient.

``torch.nn.utils.parametrizations.spectral_norm`` computes σ = uᵀ W v (u, v from one power
step) and W / σ through autograd: a dozen small kernels forward and backward per weight,
several times the cost of a plain weight, which at four weights per step was a large share
of a PMP step (measured earlier: docs/performance-notes.md). This is the same
parametrization (it subclasses torch's: the same buffers ``_u``/``_v``, the same
initialisation from the same random draws, the same power step, the same state dict) with
the division written as one autograd function, and a PMP step normalises all its weights
in one batch (:func:`normalised_weights`). Spectral normalisation is a utility choice: no
sensitivity depends on ‖W‖ (docs/privacy.md §2.2), so nothing here touches the privacy
analysis.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import _SpectralNorm


class _DivideBySigmas(torch.autograd.Function):
    """W_i / σ_i with σ_i = u_iᵀ W_i v_i for k stacked weights of one shape and fixed u_i, v_i,
    and its gradient

        ∂L/∂W_i = (G_i − ⟨G_i, W_i/σ_i⟩ u_i v_iᵀ) / σ_i       (G_i = ∂L/∂(W_i/σ_i))

    which is what autograd derives through vdot, mv and div, in a few batched kernels."""

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor, v: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        stacked = torch.stack(weights)  # k x h x w
        sigma = torch.bmm(u.unsqueeze(1), torch.bmm(stacked, v.unsqueeze(2))).view(-1, 1, 1)
        normalised = stacked / sigma
        ctx.save_for_backward(normalised, u, v, sigma)
        ctx.set_materialize_grads(False)  # an unused weight keeps grad None, as on its own
        return tuple(normalised.unbind(0))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        normalised, u, v, sigma = ctx.saved_tensors
        grad = torch.stack([torch.zeros_like(n) if g is None else g for g, n in zip(grads, normalised)])
        inner = torch.sum(grad * normalised, dim=(1, 2), keepdim=True)
        outer = torch.bmm(u.unsqueeze(2), v.unsqueeze(1))  # u_i v_iᵀ
        result = grad.sub_(outer.mul_(inner)).div_(sigma).unbind(0)
        return (None, None, *(None if g is None else r for g, r in zip(grads, result)))


def _normalise(weights: list[torch.Tensor], norms: list[SpectralNorm]) -> list[torch.Tensor]:
    """W / σ(W) for each weight and its parametrization, together: in training mode one power
    step u = normalize(W v), v = normalize(Wᵀ u) first, written back to each ``_u``/``_v``
    (x / max(‖x‖, eps), as torch's ``_power_method`` computes it)."""
    u = torch.stack([n._u for n in norms])  # copies: the saved u, v survive later power steps
    v = torch.stack([n._v for n in norms])
    if norms[0].training:
        with torch.no_grad():
            stacked, eps = torch.stack([w.detach() for w in weights]), norms[0].eps
            for _ in range(norms[0].n_power_iterations):
                u = torch.bmm(stacked, v.unsqueeze(2)).squeeze(2)
                u.div_(torch.linalg.vector_norm(u, dim=1, keepdim=True).clamp_(min=eps))
                v = torch.bmm(stacked.transpose(1, 2), u.unsqueeze(2)).squeeze(2)
                v.div_(torch.linalg.vector_norm(v, dim=1, keepdim=True).clamp_(min=eps))
            for norm, new_u, new_v in zip(norms, u, v):
                norm._u.copy_(new_u)
                norm._v.copy_(new_v)
    return list(_DivideBySigmas.apply(u, v, *weights))


class SpectralNorm(_SpectralNorm):
    """torch's ``_SpectralNorm`` for a matrix normalised along dim 0, computed by ``_normalise``."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        if weight.ndim != 2 or self.dim != 0:
            return super().forward(weight)
        return _normalise([weight], [self])[0]


def spectral_norm(module: nn.Module, name: str = "weight") -> nn.Module:
    """``torch.nn.utils.parametrizations.spectral_norm(module)`` with the defaults (one power
    step, eps 1e-12, dim 0 for a Linear), made with :class:`SpectralNorm`."""
    weight = getattr(module, name)
    parametrize.register_parametrization(module, name, SpectralNorm(weight, n_power_iterations=1, dim=0, eps=1e-12))
    return module


def normalised_weights(modules: list[nn.Module]) -> list[torch.Tensor]:
    """``[m.weight for m in modules]`` for Linear modules normalised by :class:`SpectralNorm`,
    computed together: one power step and one division for all (in training mode, the power
    step updates each module's ``_u``/``_v`` as its own forward would). Modules without it,
    of other shapes or settings, or in mixed training modes are read one by one."""
    norms = [_spectral_norm_of(m) for m in modules]
    if len(modules) < 2 or any(n is None for n in norms):
        return [m.weight for m in modules]
    raw = [m.parametrizations.weight.original for m in modules]
    if len({tuple(w.shape) for w in raw}) != 1 or len({(n.n_power_iterations, n.eps, n.training) for n in norms}) != 1:
        return [m.weight for m in modules]
    return _normalise(raw, norms)


def _spectral_norm_of(module: nn.Module) -> SpectralNorm | None:
    if not parametrize.is_parametrized(module, "weight"):
        return None
    chain = module.parametrizations.weight
    if len(chain) != 1 or not isinstance(chain[0], SpectralNorm) or chain[0].dim != 0:
        return None
    return chain[0]
