"""The rules of a `program` job (the user's own loop): what it may and may not combine with."""

from __future__ import annotations

from collections.abc import Iterator

from workers.spec.errors import Violation
from workers.spec.job import PROGRAM_REFUSES, JobSpec
from workers.spec.parallel import ParallelSpec

# Set on every rank by the runner (workers/program/environment.py): a program may not override them.
RESERVED_ENV = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES",
})
PROGRAM_FAULTS = ("crash", "hang", "slow")  # the others poison Trainyard's own loss and parameters


def program_violations(spec: JobSpec) -> Iterator[Violation]:
    program = spec.program
    if program is None:
        return
    for section in PROGRAM_REFUSES:
        if section in spec.model_fields_set:
            yield Violation(section, f"{section}: is refused with program (the program brings its own loop, "
                                     f"model and data); remove {section!r} or program")
    if (program.command is None) == (program.function is None):
        yield Violation("program.command", "program.command: give exactly one of program.command and "
                                           "program.function")
    if program.command is not None and spec.parallel != ParallelSpec():
        yield Violation("parallel", "parallel: applies to program.function only (it gives the function a "
                                    "DeviceMesh); a command sets up its own process groups")
    if program.command is not None and program.config:
        yield Violation("program.config", "program.config: is the argument of program.function; a command "
                                          "takes its arguments in program.command")
    if program.command is not None and not program.command[0].strip():
        yield Violation("program.command", "program.command: the first element names the executable and "
                                           "may not be empty")
    for name in sorted(program.env):
        if name in RESERVED_ENV or name.startswith("TRAINYARD_"):
            yield Violation("program.env", f"program.env: may not set {name} (the runner sets it on every rank)")
    if spec.parallel.pp > 1 or spec.parallel.zero or spec.parallel.sdp is not None:
        yield Violation("parallel", "parallel: a program's mesh takes dp and tp only (pp, zero and sdp are "
                                    "strategies of Trainyard's own loop)")
    for i, fault in enumerate(spec.fault_injection):
        if fault.kind not in PROGRAM_FAULTS:
            yield Violation(f"fault_injection[{i}].kind",
                            f"fault_injection[{i}].kind must be one of {', '.join(PROGRAM_FAULTS)} for a program "
                            f"(kind={fault.kind!r})")
        elif fault.during != "step":
            yield Violation(f"fault_injection[{i}].during",
                            f"fault_injection[{i}].during must be 'step' for a program: Trainyard runs no final "
                            f"validation of a program's (during={fault.during!r})")
