from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReleasePlan(_message.Message):
    __slots__ = ("pass_sizes", "participation_bound")
    PASS_SIZES_FIELD_NUMBER: _ClassVar[int]
    PARTICIPATION_BOUND_FIELD_NUMBER: _ClassVar[int]
    pass_sizes: _containers.RepeatedScalarFieldContainer[int]
    participation_bound: int
    def __init__(self, pass_sizes: _Optional[_Iterable[int]] = ..., participation_bound: _Optional[int] = ...) -> None: ...

class CalibrateRequest(_message.Message):
    __slots__ = ("mechanism", "plan", "target_epsilon", "delta")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    TARGET_EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    mechanism: str
    plan: ReleasePlan
    target_epsilon: float
    delta: float
    def __init__(self, mechanism: _Optional[str] = ..., plan: _Optional[_Union[ReleasePlan, _Mapping]] = ..., target_epsilon: _Optional[float] = ..., delta: _Optional[float] = ...) -> None: ...

class CalibrateReply(_message.Message):
    __slots__ = ("noise_multiplier", "epsilon", "accountant", "release_event_json", "counted_releases")
    NOISE_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    COUNTED_RELEASES_FIELD_NUMBER: _ClassVar[int]
    noise_multiplier: float
    epsilon: float
    accountant: str
    release_event_json: str
    counted_releases: int
    def __init__(self, noise_multiplier: _Optional[float] = ..., epsilon: _Optional[float] = ..., accountant: _Optional[str] = ..., release_event_json: _Optional[str] = ..., counted_releases: _Optional[int] = ...) -> None: ...

class EstimateRequest(_message.Message):
    __slots__ = ("release_event_json", "plan", "delta")
    RELEASE_EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    release_event_json: str
    plan: ReleasePlan
    delta: float
    def __init__(self, release_event_json: _Optional[str] = ..., plan: _Optional[_Union[ReleasePlan, _Mapping]] = ..., delta: _Optional[float] = ...) -> None: ...

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
    __slots__ = ("run_id", "privacy_unit", "accounting", "epsilon_budget", "delta", "release_event_json", "participation_bound", "extractor", "details_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_UNIT_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    EPSILON_BUDGET_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    RELEASE_EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    PARTICIPATION_BOUND_FIELD_NUMBER: _ClassVar[int]
    EXTRACTOR_FIELD_NUMBER: _ClassVar[int]
    DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    privacy_unit: str
    accounting: str
    epsilon_budget: float
    delta: float
    release_event_json: str
    participation_bound: int
    extractor: str
    details_json: str
    def __init__(self, run_id: _Optional[str] = ..., privacy_unit: _Optional[str] = ..., accounting: _Optional[str] = ..., epsilon_budget: _Optional[float] = ..., delta: _Optional[float] = ..., release_event_json: _Optional[str] = ..., participation_bound: _Optional[int] = ..., extractor: _Optional[str] = ..., details_json: _Optional[str] = ...) -> None: ...

class ChargeRequest(_message.Message):
    __slots__ = ("run_id", "seq", "pass_id", "kind", "num_nodes", "release_event_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    RELEASE_EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    seq: int
    pass_id: str
    kind: str
    num_nodes: int
    release_event_json: str
    def __init__(self, run_id: _Optional[str] = ..., seq: _Optional[int] = ..., pass_id: _Optional[str] = ..., kind: _Optional[str] = ..., num_nodes: _Optional[int] = ..., release_event_json: _Optional[str] = ...) -> None: ...

class ChargeReceipt(_message.Message):
    __slots__ = ("run_id", "seq", "counted", "epsilon_spent", "epsilon_budget")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_BUDGET_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    seq: int
    counted: bool
    epsilon_spent: float
    epsilon_budget: float
    def __init__(self, run_id: _Optional[str] = ..., seq: _Optional[int] = ..., counted: _Optional[bool] = ..., epsilon_spent: _Optional[float] = ..., epsilon_budget: _Optional[float] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class CloseRunRequest(_message.Message):
    __slots__ = ("run_id", "status", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    status: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("run_id", "status", "epsilon_budget", "epsilon_spent", "delta", "accounting", "assumption", "charges", "counted_charges", "accountant")
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
    def __init__(self, run_id: _Optional[str] = ..., status: _Optional[str] = ..., epsilon_budget: _Optional[float] = ..., epsilon_spent: _Optional[float] = ..., delta: _Optional[float] = ..., accounting: _Optional[str] = ..., assumption: _Optional[str] = ..., charges: _Optional[int] = ..., counted_charges: _Optional[int] = ..., accountant: _Optional[str] = ...) -> None: ...
