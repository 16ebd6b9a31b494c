from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AlignRequest(_message.Message):
    __slots__ = ("dataset", "alignment_id", "pad_to")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PAD_TO_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    alignment_id: str
    pad_to: int
    def __init__(self, dataset: _Optional[str] = ..., alignment_id: _Optional[str] = ..., pad_to: _Optional[int] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ("run_config_json", "resume_run_id")
    RUN_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    RESUME_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_config_json: str
    resume_run_id: str
    def __init__(self, run_config_json: _Optional[str] = ..., resume_run_id: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("phase", "epoch", "epochs", "step", "total_steps", "loss", "epsilon_spent", "message", "run_id", "accounting", "epsilon_budget")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    EPSILON_BUDGET_FIELD_NUMBER: _ClassVar[int]
    phase: str
    epoch: int
    epochs: int
    step: int
    total_steps: int
    loss: float
    epsilon_spent: float
    message: str
    run_id: str
    accounting: str
    epsilon_budget: float
    def __init__(self, phase: _Optional[str] = ..., epoch: _Optional[int] = ..., epochs: _Optional[int] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., loss: _Optional[float] = ..., epsilon_spent: _Optional[float] = ..., message: _Optional[str] = ..., run_id: _Optional[str] = ..., accounting: _Optional[str] = ..., epsilon_budget: _Optional[float] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("progress", "summary_json", "result_json")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_JSON_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    progress: Progress
    summary_json: str
    result_json: str
    def __init__(self, progress: _Optional[_Union[Progress, _Mapping]] = ..., summary_json: _Optional[str] = ..., result_json: _Optional[str] = ...) -> None: ...
