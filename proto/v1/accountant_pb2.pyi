from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LeaseRequest(_message.Message):
    __slots__ = ("run_id", "lease", "ttl_s")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    lease: str
    ttl_s: float
    def __init__(self, run_id: _Optional[str] = ..., lease: _Optional[str] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("run_id", "expires_in_s")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    expires_in_s: float
    def __init__(self, run_id: _Optional[str] = ..., expires_in_s: _Optional[float] = ...) -> None: ...

class PlannedPass(_message.Message):
    __slots__ = ("kind", "releases")
    KIND_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    releases: int
    def __init__(self, kind: _Optional[str] = ..., releases: _Optional[int] = ...) -> None: ...

class PlanRule(_message.Message):
    __slots__ = ("kind", "participation_bound", "sampling_probability", "noise_scale", "mechanism", "sensitivities", "sampling_probs", "repeats")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARTICIPATION_BOUND_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    NOISE_SCALE_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    SENSITIVITIES_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PROBS_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    participation_bound: int
    sampling_probability: float
    noise_scale: float
    mechanism: str
    sensitivities: _containers.RepeatedScalarFieldContainer[float]
    sampling_probs: _containers.RepeatedScalarFieldContainer[float]
    repeats: int
    def __init__(self, kind: _Optional[str] = ..., participation_bound: _Optional[int] = ..., sampling_probability: _Optional[float] = ..., noise_scale: _Optional[float] = ..., mechanism: _Optional[str] = ..., sensitivities: _Optional[_Iterable[float]] = ..., sampling_probs: _Optional[_Iterable[float]] = ..., repeats: _Optional[int] = ...) -> None: ...

class ReleasePlan(_message.Message):
    __slots__ = ("passes", "rules")
    PASSES_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    passes: _containers.RepeatedCompositeFieldContainer[PlannedPass]
    rules: _containers.RepeatedCompositeFieldContainer[PlanRule]
    def __init__(self, passes: _Optional[_Iterable[_Union[PlannedPass, _Mapping]]] = ..., rules: _Optional[_Iterable[_Union[PlanRule, _Mapping]]] = ...) -> None: ...

class ChargeRule(_message.Message):
    __slots__ = ("kind", "release_event_json", "participation_bound")
    KIND_FIELD_NUMBER: _ClassVar[int]
    RELEASE_EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    PARTICIPATION_BOUND_FIELD_NUMBER: _ClassVar[int]
    kind: str
    release_event_json: str
    participation_bound: int
    def __init__(self, kind: _Optional[str] = ..., release_event_json: _Optional[str] = ..., participation_bound: _Optional[int] = ...) -> None: ...

class CalibrateRequest(_message.Message):
    __slots__ = ("mechanism", "plan", "target_epsilon", "delta", "accounting", "accountant")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    TARGET_EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    mechanism: str
    plan: ReleasePlan
    target_epsilon: float
    delta: float
    accounting: str
    accountant: str
    def __init__(self, mechanism: _Optional[str] = ..., plan: _Optional[_Union[ReleasePlan, _Mapping]] = ..., target_epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., accounting: _Optional[str] = ..., accountant: _Optional[str] = ...) -> None: ...

class CalibrateReply(_message.Message):
    __slots__ = ("noise_multiplier", "epsilon", "accountant", "rules", "counted_releases")
    NOISE_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    COUNTED_RELEASES_FIELD_NUMBER: _ClassVar[int]
    noise_multiplier: float
    epsilon: float
    accountant: str
    rules: _containers.RepeatedCompositeFieldContainer[ChargeRule]
    counted_releases: int
    def __init__(self, noise_multiplier: _Optional[float] = ..., epsilon: _Optional[float] = ..., accountant: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[ChargeRule, _Mapping]]] = ..., counted_releases: _Optional[int] = ...) -> None: ...

class EstimateRequest(_message.Message):
    __slots__ = ("rules", "passes", "delta", "accounting", "accountant")
    RULES_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[ChargeRule]
    passes: _containers.RepeatedCompositeFieldContainer[PlannedPass]
    delta: float
    accounting: str
    accountant: str
    def __init__(self, rules: _Optional[_Iterable[_Union[ChargeRule, _Mapping]]] = ..., passes: _Optional[_Iterable[_Union[PlannedPass, _Mapping]]] = ..., delta: _Optional[float] = ..., accounting: _Optional[str] = ..., accountant: _Optional[str] = ...) -> None: ...

class EstimateReply(_message.Message):
    __slots__ = ("epsilon", "accountant", "counted_releases")
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    COUNTED_RELEASES_FIELD_NUMBER: _ClassVar[int]
    epsilon: float
    accountant: str
    counted_releases: int
    def __init__(self, epsilon: _Optional[float] = ..., accountant: _Optional[str] = ..., counted_releases: _Optional[int] = ...) -> None: ...

class CreateRunRequest(_message.Message):
    __slots__ = ("run_id", "privacy_unit", "accounting", "epsilon_budget", "delta", "accountant", "rules", "extractor", "details_json", "assumption_note", "lease", "lease_ttl_s")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_UNIT_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    EPSILON_BUDGET_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    EXTRACTOR_FIELD_NUMBER: _ClassVar[int]
    DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    ASSUMPTION_NOTE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    privacy_unit: str
    accounting: str
    epsilon_budget: float
    delta: float
    accountant: str
    rules: _containers.RepeatedCompositeFieldContainer[ChargeRule]
    extractor: str
    details_json: str
    assumption_note: str
    lease: str
    lease_ttl_s: float
    def __init__(self, run_id: _Optional[str] = ..., privacy_unit: _Optional[str] = ..., accounting: _Optional[str] = ..., epsilon_budget: _Optional[float] = ..., delta: _Optional[float] = ..., accountant: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[ChargeRule, _Mapping]]] = ..., extractor: _Optional[str] = ..., details_json: _Optional[str] = ..., assumption_note: _Optional[str] = ..., lease: _Optional[str] = ..., lease_ttl_s: _Optional[float] = ...) -> None: ...

class ChargeRequest(_message.Message):
    __slots__ = ("run_id", "pass_id", "kind", "num_nodes", "release_event_json", "release_key", "nodes_digest", "lease")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    RELEASE_EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    RELEASE_KEY_FIELD_NUMBER: _ClassVar[int]
    NODES_DIGEST_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    pass_id: str
    kind: str
    num_nodes: int
    release_event_json: str
    release_key: str
    nodes_digest: str
    lease: str
    def __init__(self, run_id: _Optional[str] = ..., pass_id: _Optional[str] = ..., kind: _Optional[str] = ..., num_nodes: _Optional[int] = ..., release_event_json: _Optional[str] = ..., release_key: _Optional[str] = ..., nodes_digest: _Optional[str] = ..., lease: _Optional[str] = ...) -> None: ...

class ChargeReceipt(_message.Message):
    __slots__ = ("run_id", "seq", "counted", "epsilon_spent", "epsilon_budget", "replayed")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_BUDGET_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    seq: int
    counted: bool
    epsilon_spent: float
    epsilon_budget: float
    replayed: bool
    def __init__(self, run_id: _Optional[str] = ..., seq: _Optional[int] = ..., counted: _Optional[bool] = ..., epsilon_spent: _Optional[float] = ..., epsilon_budget: _Optional[float] = ..., replayed: _Optional[bool] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class CloseRunRequest(_message.Message):
    __slots__ = ("run_id", "status", "reason", "lease")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    status: str
    reason: str
    lease: str
    def __init__(self, run_id: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., lease: _Optional[str] = ...) -> None: ...

class ReopenRunRequest(_message.Message):
    __slots__ = ("run_id", "reason", "lease", "lease_ttl_s")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    lease: str
    lease_ttl_s: float
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ..., lease: _Optional[str] = ..., lease_ttl_s: _Optional[float] = ...) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("run_id", "status", "epsilon_budget", "epsilon_spent", "delta", "accounting", "assumption", "charges", "counted_charges", "accountant", "epsilon_events", "epsilon_bound6")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_BUDGET_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    ASSUMPTION_FIELD_NUMBER: _ClassVar[int]
    CHARGES_FIELD_NUMBER: _ClassVar[int]
    COUNTED_CHARGES_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_EVENTS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_BOUND6_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    status: str
    epsilon_budget: float
    epsilon_spent: float
    delta: float
    accounting: str
    assumption: str
    charges: int
    counted_charges: int
    accountant: str
    epsilon_events: float
    epsilon_bound6: float
    def __init__(self, run_id: _Optional[str] = ..., status: _Optional[str] = ..., epsilon_budget: _Optional[float] = ..., epsilon_spent: _Optional[float] = ..., delta: _Optional[float] = ..., accounting: _Optional[str] = ..., assumption: _Optional[str] = ..., charges: _Optional[int] = ..., counted_charges: _Optional[int] = ..., accountant: _Optional[str] = ..., epsilon_events: _Optional[float] = ..., epsilon_bound6: _Optional[float] = ...) -> None: ...
