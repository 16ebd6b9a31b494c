from vesper.proto.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DecoderSpec(_message.Message):
    __slots__ = ("kind", "hidden_dim", "dropout")
    KIND_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_DIM_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    hidden_dim: int
    dropout: float
    def __init__(self, kind: _Optional[str] = ..., hidden_dim: _Optional[int] = ..., dropout: _Optional[float] = ...) -> None: ...

class OptimizerSpec(_message.Message):
    __slots__ = ("name", "lr", "weight_decay")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    name: str
    lr: float
    weight_decay: float
    def __init__(self, name: _Optional[str] = ..., lr: _Optional[float] = ..., weight_decay: _Optional[float] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("epsilon", "delta", "accounting", "status_url")
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    STATUS_URL_FIELD_NUMBER: _ClassVar[int]
    epsilon: float
    delta: float
    accounting: str
    status_url: str
    def __init__(self, epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., accounting: _Optional[str] = ..., status_url: _Optional[str] = ...) -> None: ...

class SetupRunRequest(_message.Message):
    __slots__ = ("run_id", "dataset", "decoder", "optimizer", "seed", "budget", "embedding_dim", "num_layers", "wire_dtype", "split_seed", "label_privacy_json", "label_run_id", "record_releases", "membership_audit", "resume", "resume_step", "edge_free_layers")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    DECODER_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_DIM_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_SEED_FIELD_NUMBER: _ClassVar[int]
    LABEL_PRIVACY_JSON_FIELD_NUMBER: _ClassVar[int]
    LABEL_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_RELEASES_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIP_AUDIT_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    RESUME_STEP_FIELD_NUMBER: _ClassVar[int]
    EDGE_FREE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    dataset: str
    decoder: DecoderSpec
    optimizer: OptimizerSpec
    seed: int
    budget: Budget
    embedding_dim: int
    num_layers: int
    wire_dtype: _tensor_pb2.DType
    split_seed: int
    label_privacy_json: str
    label_run_id: str
    record_releases: bool
    membership_audit: bool
    resume: bool
    resume_step: int
    edge_free_layers: int
    def __init__(self, run_id: _Optional[str] = ..., dataset: _Optional[str] = ..., decoder: _Optional[_Union[DecoderSpec, _Mapping]] = ..., optimizer: _Optional[_Union[OptimizerSpec, _Mapping]] = ..., seed: _Optional[int] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., embedding_dim: _Optional[int] = ..., num_layers: _Optional[int] = ..., wire_dtype: _Optional[_Union[_tensor_pb2.DType, str]] = ..., split_seed: _Optional[int] = ..., label_privacy_json: _Optional[str] = ..., label_run_id: _Optional[str] = ..., record_releases: _Optional[bool] = ..., membership_audit: _Optional[bool] = ..., resume: _Optional[bool] = ..., resume_step: _Optional[int] = ..., edge_free_layers: _Optional[int] = ...) -> None: ...

class SetupRunReply(_message.Message):
    __slots__ = ("train_ids", "val_ids", "test_ids", "num_classes", "metric", "split", "num_nodes", "label_ledger_id", "label_epsilon_spent", "label_epsilon_budget", "label_delta", "query_ids", "label_note")
    TRAIN_IDS_FIELD_NUMBER: _ClassVar[int]
    VAL_IDS_FIELD_NUMBER: _ClassVar[int]
    TEST_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    LABEL_LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    LABEL_EPSILON_BUDGET_FIELD_NUMBER: _ClassVar[int]
    LABEL_DELTA_FIELD_NUMBER: _ClassVar[int]
    QUERY_IDS_FIELD_NUMBER: _ClassVar[int]
    LABEL_NOTE_FIELD_NUMBER: _ClassVar[int]
    train_ids: _containers.RepeatedScalarFieldContainer[int]
    val_ids: _containers.RepeatedScalarFieldContainer[int]
    test_ids: _containers.RepeatedScalarFieldContainer[int]
    num_classes: int
    metric: str
    split: str
    num_nodes: int
    label_ledger_id: str
    label_epsilon_spent: float
    label_epsilon_budget: float
    label_delta: float
    query_ids: _containers.RepeatedScalarFieldContainer[int]
    label_note: str
    def __init__(self, train_ids: _Optional[_Iterable[int]] = ..., val_ids: _Optional[_Iterable[int]] = ..., test_ids: _Optional[_Iterable[int]] = ..., num_classes: _Optional[int] = ..., metric: _Optional[str] = ..., split: _Optional[str] = ..., num_nodes: _Optional[int] = ..., label_ledger_id: _Optional[str] = ..., label_epsilon_spent: _Optional[float] = ..., label_epsilon_budget: _Optional[float] = ..., label_delta: _Optional[float] = ..., query_ids: _Optional[_Iterable[int]] = ..., label_note: _Optional[str] = ...) -> None: ...

class TrainStep(_message.Message):
    __slots__ = ("run_id", "step", "node_ids", "embeddings", "checkpoint")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    node_ids: _containers.RepeatedScalarFieldContainer[int]
    embeddings: _tensor_pb2.Tensor
    checkpoint: bool
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., node_ids: _Optional[_Iterable[int]] = ..., embeddings: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., checkpoint: _Optional[bool] = ...) -> None: ...

class TrainStepReply(_message.Message):
    __slots__ = ("run_id", "step", "gradient", "loss")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    gradient: _tensor_pb2.Tensor
    loss: float
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., gradient: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., loss: _Optional[float] = ...) -> None: ...

class EvalChunk(_message.Message):
    __slots__ = ("run_id", "eval_id", "split", "node_ids", "embeddings")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EVAL_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    eval_id: int
    split: str
    node_ids: _containers.RepeatedScalarFieldContainer[int]
    embeddings: _tensor_pb2.Tensor
    def __init__(self, run_id: _Optional[str] = ..., eval_id: _Optional[int] = ..., split: _Optional[str] = ..., node_ids: _Optional[_Iterable[int]] = ..., embeddings: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class CollectReply(_message.Message):
    __slots__ = ("run_id", "answered_ids", "label_epsilon_spent", "label_note")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_IDS_FIELD_NUMBER: _ClassVar[int]
    LABEL_EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    LABEL_NOTE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    answered_ids: _containers.RepeatedScalarFieldContainer[int]
    label_epsilon_spent: float
    label_note: str
    def __init__(self, run_id: _Optional[str] = ..., answered_ids: _Optional[_Iterable[int]] = ..., label_epsilon_spent: _Optional[float] = ..., label_note: _Optional[str] = ...) -> None: ...

class Metric(_message.Message):
    __slots__ = ("split", "name", "value", "count")
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    split: str
    name: str
    value: float
    count: int
    def __init__(self, split: _Optional[str] = ..., name: _Optional[str] = ..., value: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class EvalResult(_message.Message):
    __slots__ = ("run_id", "eval_id", "metrics", "decoder_head", "head_metrics", "head_errors")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EVAL_ID_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    DECODER_HEAD_FIELD_NUMBER: _ClassVar[int]
    HEAD_METRICS_FIELD_NUMBER: _ClassVar[int]
    HEAD_ERRORS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    eval_id: int
    metrics: _containers.RepeatedCompositeFieldContainer[Metric]
    decoder_head: str
    head_metrics: _containers.RepeatedCompositeFieldContainer[Metric]
    head_errors: _containers.RepeatedCompositeFieldContainer[Metric]
    def __init__(self, run_id: _Optional[str] = ..., eval_id: _Optional[int] = ..., metrics: _Optional[_Iterable[_Union[Metric, _Mapping]]] = ..., decoder_head: _Optional[str] = ..., head_metrics: _Optional[_Iterable[_Union[Metric, _Mapping]]] = ..., head_errors: _Optional[_Iterable[_Union[Metric, _Mapping]]] = ...) -> None: ...

class FinishRunRequest(_message.Message):
    __slots__ = ("run_id", "status", "reason", "edge_free_head_to")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EDGE_FREE_HEAD_TO_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    status: str
    reason: str
    edge_free_head_to: str
    def __init__(self, run_id: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., edge_free_head_to: _Optional[str] = ...) -> None: ...

class FinishRunReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AlignPoints(_message.Message):
    __slots__ = ("alignment_id", "dataset", "total", "part", "points")
    ALIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    alignment_id: str
    dataset: str
    total: int
    part: str
    points: bytes
    def __init__(self, alignment_id: _Optional[str] = ..., dataset: _Optional[str] = ..., total: _Optional[int] = ..., part: _Optional[str] = ..., points: _Optional[bytes] = ...) -> None: ...

class AlignSummary(_message.Message):
    __slots__ = ("alignment_id", "size")
    ALIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    alignment_id: str
    size: int
    def __init__(self, alignment_id: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class PredictReply(_message.Message):
    __slots__ = ("run_id", "nodes", "pass_index")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PASS_INDEX_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    nodes: int
    pass_index: int
    def __init__(self, run_id: _Optional[str] = ..., nodes: _Optional[int] = ..., pass_index: _Optional[int] = ...) -> None: ...

class ScoresRequest(_message.Message):
    __slots__ = ("run_id", "select", "keys")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SELECT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    select: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., select: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class ScoresPlan(_message.Message):
    __slots__ = ("run_id", "rows", "predicted", "classes")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    rows: int
    predicted: bool
    classes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., rows: _Optional[int] = ..., predicted: _Optional[bool] = ..., classes: _Optional[_Iterable[str]] = ...) -> None: ...

class ScoreRows(_message.Message):
    __slots__ = ("classes", "keys", "predicted", "probabilities")
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedScalarFieldContainer[str]
    keys: _containers.RepeatedScalarFieldContainer[str]
    predicted: _containers.RepeatedScalarFieldContainer[str]
    probabilities: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, classes: _Optional[_Iterable[str]] = ..., keys: _Optional[_Iterable[str]] = ..., predicted: _Optional[_Iterable[str]] = ..., probabilities: _Optional[_Iterable[float]] = ...) -> None: ...
