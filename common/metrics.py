"""Each service's Prometheus metrics (``metrics_listen``; docs/deployment.md, "Metrics and logs").

Every service has a registry of its own (never prometheus-client's global one, so services
in one process, as in tests, do not collide), the gRPC server's families (calls by status,
bytes in and out, common/grpc_observer.py) and its own:

* the accountant: charges and refusals by run and kind, the charge latency, ε spent and the
  budget per run;
* party A: training steps and releases (with their bytes) by run: steps and releases per
  second are Prometheus's ``rate()`` of these counters;
* party B: the latency of a training step.

Counting is a few dictionary look-ups per step or charge, never work per element.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from vesper.common.config import LISTEN, check_metrics_listen
from vesper.common.writable import SettingError

log = logging.getLogger(__name__)

# the accountant's charge is an SQLite commit (a millisecond or so); B's step is a decoder's
# forward and backward pass on one batch (milliseconds to seconds)
CHARGE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServiceMetrics:
    """A service's registry with the gRPC server's families; ``start`` serves it at /metrics."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=True)
        self.grpc_handled = Counter(
            "vesper_grpc_server_handled", "gRPC calls this server completed, by method and status code (OK included)",
            ("service", "method", "code"), registry=self.registry,
        )
        self.grpc_received_bytes = Counter(
            "vesper_grpc_server_received_bytes", "Serialized bytes of the request messages this server received",
            ("service", "method"), registry=self.registry,
        )
        self.grpc_sent_bytes = Counter(
            "vesper_grpc_server_sent_bytes", "Serialized bytes of the response messages this server sent",
            ("service", "method"), registry=self.registry,
        )

    def start(self, listen: str) -> int:
        """Serve /metrics at ``listen`` (host:port) on a thread of its own; the bound port.
        An address it cannot listen on stops the service (SettingError naming the setting)."""
        setting = f"{self.service}.metrics_listen"
        match = LISTEN.fullmatch(check_metrics_listen(listen, setting))
        assert match is not None
        try:
            server, _thread = start_http_server(int(match["port"]), match["host"].strip("[]"), registry=self.registry)
        except OSError as exc:
            raise SettingError(
                f"{setting} = {listen!r}: cannot serve metrics there ({exc}); choose a free port, or 0 for any"
            ) from None
        return int(server.server_port)


def start_metrics(metrics: ServiceMetrics | None, listen: str | None) -> int | None:
    """Serve ``metrics`` at ``listen`` when the service has metrics; the bound port, or None."""
    if metrics is None or listen is None:
        return None
    port = metrics.start(listen)
    log.info("%s: Prometheus metrics at http://%s/metrics", metrics.service, f"{listen.rsplit(':', 1)[0]}:{port}")
    return port


class AccountantMetrics(ServiceMetrics):
    def __init__(self) -> None:
        super().__init__("accountant")
        self.charges = Counter(
            "vesper_accountant_charges", "Charges committed to the ledger (one per ledger row), by run and kind",
            ("run", "kind"), registry=self.registry,
        )
        self.retries = Counter(
            "vesper_accountant_charge_retries",
            "Charges repeated under a release key already in the ledger (answered from it, not charged again)",
            ("run", "kind"), registry=self.registry,
        )
        self.refusals = Counter(
            "vesper_accountant_charge_refusals",
            "Charges the accountant refused, by run, kind and reason (RESOURCE_EXHAUSTED: over the budget)",
            ("run", "kind", "reason"), registry=self.registry,
        )
        self.charge_seconds = Histogram(
            "vesper_accountant_charge_seconds", "Time to decide and commit one charge (refusals included)",
            registry=self.registry, buckets=CHARGE_BUCKETS,
        )
        self.epsilon_spent = Gauge(
            "vesper_accountant_epsilon_spent", "ε spent by a run, as the ledger computes it", ("run",),
            registry=self.registry,
        )
        self.epsilon_budget = Gauge(
            "vesper_accountant_epsilon_budget", "A run's ε budget", ("run",), registry=self.registry,
        )

    def run_status(self, run_id: str, epsilon_spent: float, epsilon_budget: float) -> None:
        self.epsilon_spent.labels(run_id).set(epsilon_spent)
        self.epsilon_budget.labels(run_id).set(epsilon_budget)


@dataclass(frozen=True)
class RunCounters:
    """Party A's counters of one run (``PartyAMetrics.for_run``); ``NO_COUNTERS`` counts nothing."""

    metrics: PartyAMetrics | None
    run_id: str

    def step(self) -> None:
        if self.metrics is not None:
            self.metrics.steps.labels(self.run_id).inc()

    def release(self, kind: str) -> None:
        """A release the accountant has charged (every release is charged before it leaves A)."""
        if self.metrics is not None:
            self.metrics.releases.labels(self.run_id, kind).inc()

    def wire_bytes(self, kind: str, size: int) -> None:
        """A released tensor's serialized size, once it is encoded for B."""
        if self.metrics is not None:
            self.metrics.release_bytes.labels(self.run_id, kind).inc(size)


NO_COUNTERS = RunCounters(None, "")


class PartyAMetrics(ServiceMetrics):
    def __init__(self) -> None:
        super().__init__("party_a")
        self.steps = Counter(
            "vesper_party_a_steps", "Training steps B answered, by run (steps per second: rate())", ("run",),
            registry=self.registry,
        )
        self.releases = Counter(
            "vesper_party_a_releases", "Releases charged and handed to the wire, by run and kind", ("run", "kind"),
            registry=self.registry,
        )
        self.release_bytes = Counter(
            "vesper_party_a_release_bytes", "Serialized bytes of the released tensors, by run and kind",
            ("run", "kind"), registry=self.registry,
        )

    def for_run(self, run_id: str) -> RunCounters:
        return RunCounters(self, run_id)


class PartyBMetrics(ServiceMetrics):
    def __init__(self) -> None:
        super().__init__("party_b")
        self.step_seconds = Histogram(
            "vesper_party_b_step_seconds",
            "Time party B takes for one training step: decode, decoder forward and backward, encode the gradient",
            registry=self.registry, buckets=STEP_BUCKETS,
        )
