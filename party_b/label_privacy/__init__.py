"""Party B's label-privacy mechanisms: they protect B's training labels against party A.

* :mod:`.randomized_response` — k-ary randomised response, applied once to B's training
  labels (label DP, one charge on B's own ledger, everything after is post-processing).
* :mod:`.pate` — DP-GPL's teacher ensemble with Confident-GNMax: teachers trained at B on
  disjoint groups of its labelled nodes label a few query nodes; the student learns only
  from those noisy labels.

Both are pure functions of their inputs and a ``torch.Generator``; they declare
dp-accounting DpEvents and never compute ε (``vesper.common.privacy.accounting`` does).
The derivations are in docs/label-privacy.md.
"""
