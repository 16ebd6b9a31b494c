"""ε of a DpEvent at δ, and calibration of a noise multiplier to a target ε.

Two accountants can be asked for (``accountant=``); every :class:`EpsilonResult`
names the one that actually produced its number (docs/accounting.md). The code is split
by mechanism (:mod:`.gaussian`, :mod:`.randomized_response`, :mod:`.pld`, :mod:`.rdp`);
:mod:`.dispatch` holds the one table from :data:`AccountantName` to accountant, and
:mod:`.calibration` searches the noise multiplier for a target ε. The accountants:

``"pld"`` (the default)
    * ``gaussian-exact``: an event made only of Gaussian mechanisms and no-ops is one
      Gaussian mechanism with σ_eff = (Σ_i n_i / z_i²)^(-1/2) — that is also what its
      privacy loss distribution is — so ε comes exactly from the analytic Gaussian
      mechanism (Balle & Wang [BW18, eq. 6]) via ``dp_accounting.get_epsilon_gaussian``,
      re-checked against δ and moved up if the root finder landed a hair low.
    * ``pld``: dp-accounting's privacy-loss distributions with pessimistic
      (connect-the-dots) discretisation at interval 1e-4.
    * ``pld-coarse``: the same at a coarser interval (2e-4, 5e-4, 1e-3 or 2e-3), the
      finest within :data:`PLD_MAX_SINGLE_POINTS` and :data:`PLD_MAX_COMPOSED_POINTS`
      when 1e-4 is not; still pessimistic, so still an upper bound.
    * ``rdp-fallback``: when even 2e-3 is too large, dp-accounting's RDP accountant.
    * ``pld`` also covers ``MixtureOfGaussiansDpEvent`` (a Gaussian whose sensitivity is
      random, docs/extractors/heterpoisson.md) with dp-accounting's mixture PLD; there is
      no RDP of a mixture here, so such an event has no ``rdp-fallback``: the PLD ladder
      ends at its coarsest interval, and the ``rdp`` accountant refuses it.
    * ``rdp-zcdp``: an event containing a ``ZCDpEvent`` (exponential-mechanism rounds,
      docs/extractors/dpar.md) has no privacy loss distribution here, so the whole
      composition is accounted by dp-accounting's RDP accountant (ρα + ξ at each order).
    * ``rr-exact``: an event that is exactly one k-ary randomised response
      (``RandomizedResponseDpEvent(p, k)``, party B's labels, docs/label-privacy.md) is
      pure ε-DP with ε = ln((1 − p + p/k) / (p/k)) (:func:`randomized_response_epsilon`),
      whatever δ; rounded up to the next float, never down. Any other composition holding
      randomised response goes through the PLD ladder (dp-accounting's
      ``from_randomized_response``) like every other mechanism.

``"rdp"``
    * ``rdp``: dp-accounting's ``RdpAccountant`` for every event, over
      :data:`RDP_ORDERS`, converted to (ε, δ) with the bound dp-accounting takes from
      [CKS20, Prop. 12], which is
      [VESPER, Lemma 2, eq. (10)]. Randomised response is accounted under the
      replace-one relation, the only one dp-accounting has for it (see
      :func:`_rdp_accountant_for`).
    * ``rr-exact``: a lone randomised response also under ``rdp``, when its exact pure ε
      is below the RDP conversion (always, in practice: the conversion adds
      log(1/δ)/(α − 1) to an RDP that tends to the pure ε as α grows). Both are upper
      bounds, so the smaller one is; a run budgeted at the ε its RR was calibrated to
      would otherwise be refused its one charge.

ε is never rounded down: the analytic Gaussian is re-checked, the PLD rounding is
pessimistic and RDP is itself an upper bound.
"""

from vesper.common.privacy.accounting.calibration import calibrate
from vesper.common.privacy.accounting.dispatch import (
    ACCOUNTANTS,
    _check_accountant,
    _epsilon_cached,
    clear_cache,
    epsilon_of,
)
from vesper.common.privacy.accounting.gaussian import (
    _gaussian_log_delta,
    _gaussian_precision,
    _search_gaussian_epsilon,
    gaussian_epsilon,
)
from vesper.common.privacy.accounting.pld import (
    _FULL,
    _UNLIMITED,
    MIXTURE_EXTRA_INTERVALS,
    MIXTURE_MAX_SCOUT_POINTS,
    MIXTURE_MAX_SINGLE_POINTS,
    PLD_COARSE_INTERVALS,
    PLD_FINE_INTERVAL,
    PLD_MAX_COMPOSED_POINTS,
    PLD_MAX_SINGLE_POINTS,
    _leaves,
    _merge_unsampled_gaussians,
    _pld_epsilon,
    _pld_epsilon_at,
    _pld_scout,
    _single_pld,
)
from vesper.common.privacy.accounting.randomized_response import (
    _lone_randomized_response,
    randomized_response_epsilon,
)
from vesper.common.privacy.accounting.rdp import (
    _RDP_SKELETON_ORDERS,
    RDP_FRACTIONAL_ORDERS,
    RDP_ORDERS,
    _mechanism_rdp,
    _rdp,
    _rdp_supports,
)
from vesper.common.privacy.accounting.result import EpsilonResult
from vesper.common.privacy.names import AccountantName

# The private names are re-exported for the tests that check the math piece by piece.
__all__ = [
    "ACCOUNTANTS",
    "MIXTURE_EXTRA_INTERVALS",
    "MIXTURE_MAX_SCOUT_POINTS",
    "MIXTURE_MAX_SINGLE_POINTS",
    "PLD_COARSE_INTERVALS",
    "PLD_FINE_INTERVAL",
    "PLD_MAX_COMPOSED_POINTS",
    "PLD_MAX_SINGLE_POINTS",
    "RDP_FRACTIONAL_ORDERS",
    "RDP_ORDERS",
    "AccountantName",
    "EpsilonResult",
    "calibrate",
    "clear_cache",
    "epsilon_of",
    "gaussian_epsilon",
    "randomized_response_epsilon",
    "_FULL",
    "_RDP_SKELETON_ORDERS",
    "_UNLIMITED",
    "_check_accountant",
    "_epsilon_cached",
    "_gaussian_log_delta",
    "_gaussian_precision",
    "_leaves",
    "_lone_randomized_response",
    "_mechanism_rdp",
    "_merge_unsampled_gaussians",
    "_pld_epsilon",
    "_pld_epsilon_at",
    "_pld_scout",
    "_rdp",
    "_rdp_supports",
    "_search_gaussian_epsilon",
    "_single_pld",
]
