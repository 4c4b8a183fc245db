"""The job spec: one frozen description of a training job (job.py), section by section.

base.py      what every section shares        model.py  the `model` section (+ HF config facts)
data.py      the `data` section               parallel.py  the `parallel` section
job.py       JobSpec and its other sections   derived.py   values the rules and strategies derive
rules.py     the rules spanning fields        errors.py    Violation, SpecError, FieldError
messages.py  field errors in the spec's words, the 422 shape; keys.py the keys at each place
hf_config.py transformers config classes, never weights
program.py   the `program` section (the user's own loop); program_rules.py its rules
tracking.py  the `tracking` section (MLflow, TensorBoard)

A stored spec loads with `JobSpec.model_validate`; a submitted one goes through
workers/spec_loading.py (`parallel: auto`, then every rule and each strategy's own).
"""

from workers.spec.base import ENTRYPOINT_PATTERN, EntrypointSpec
from workers.spec.data import (
    ClicksDataSpec,
    DataEntrypointSpec,
    DataSpec,
    FileDataSpec,
    FilesSpec,
    LoaderSpec,
    SyntheticDataSpec,
    TextDataSpec,
)
from workers.spec.derived import (
    ModelStructure,
    clicks_shape,
    pipeline_microbatches,
    sdp_components,
    sdp_workers,
    sequence_length,
    structure_of,
)
from workers.spec.errors import (
    SPEC_ERRORS,
    FieldError,
    SpecError,
    Violation,
)
from workers.spec.job import (
    CheckpointSpec,
    FaultSpec,
    FaultToleranceSpec,
    JobSpec,
    LossSpikeSpec,
    ResourcesSpec,
    StragglerSpec,
    SupervisorSpec,
    TrainSpec,
)
from workers.spec.messages import format_validation_error
from workers.spec.model import (
    USER_MODELS,
    DLRMModelSpec,
    GPTModelSpec,
    HFConfigSource,
    HFModelSpec,
    HFPretrainedSource,
    MLPModelSpec,
    ModelEntrypointSpec,
    ModelSpec,
)
from workers.spec.parallel import (
    ASYNC_SCHEDULES,
    PIPELINE_SCHEDULES,
    SINGLE_STAGE_SCHEDULES,
    V_SCHEDULES,
    CompressionSpec,
    LocalSGDSpec,
    ParallelSpec,
    PipelineSpec,
    SDPPeriodSpec,
    SDPSpec,
)
from workers.spec.program import CODE_REF_PREFIX, ProgramSpec
from workers.spec.rules import (
    FAULT_INJECTION_ENV,
    fault_injection_allowed,
    rule_violations,
)
from workers.spec.tracking import MlflowTrackingSpec, TrackingSpec

__all__ = [
    "CheckpointSpec",
    "CompressionSpec",
    "DataSpec",
    "ENTRYPOINT_PATTERN",
    "EntrypointSpec",
    "DataEntrypointSpec",
    "FileDataSpec",
    "FilesSpec",
    "LoaderSpec",
    "fault_injection_allowed",
    "FAULT_INJECTION_ENV",
    "FaultSpec",
    "FaultToleranceSpec",
    "FieldError",
    "format_validation_error",
    "GPTModelSpec",
    "HFConfigSource",
    "HFModelSpec",
    "HFPretrainedSource",
    "JobSpec",
    "LocalSGDSpec",
    "LossSpikeSpec",
    "MlflowTrackingSpec",
    "MLPModelSpec",
    "DLRMModelSpec",
    "ClicksDataSpec",
    "clicks_shape",
    "ModelEntrypointSpec",
    "ModelSpec",
    "ModelStructure",
    "ParallelSpec",
    "pipeline_microbatches",
    "ASYNC_SCHEDULES",
    "PIPELINE_SCHEDULES",
    "PipelineSpec",
    "ProgramSpec",
    "CODE_REF_PREFIX",
    "ResourcesSpec",
    "rule_violations",
    "sdp_components",
    "sdp_workers",
    "SDPPeriodSpec",
    "SDPSpec",
    "sequence_length",
    "SINGLE_STAGE_SCHEDULES",
    "SPEC_ERRORS",
    "SpecError",
    "StragglerSpec",
    "structure_of",
    "SupervisorSpec",
    "SyntheticDataSpec",
    "TextDataSpec",
    "TrackingSpec",
    "TrainSpec",
    "USER_MODELS",
    "V_SCHEDULES",
    "Violation",
]
