"""The `program` section: the user's own training loop instead of Trainyard's.

Either a `command` run as-is on every rank with torchrun's environment, or a Python
`function` called once per rank inside an initialised process group. The session API a
program may use is the `trainyard` package (trainyard/__init__.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from workers.spec.base import ENTRYPOINT_PATTERN, Strict

CODE_REF_PREFIX = "code:"  # a working_dir uploaded with POST /v1/code: "code:<sha256 of the zip>"


class ProgramSpec(Strict):
    command: list[str] | None = Field(None, min_length=1, description="argv run on every rank, torchrun-style")
    function: str | None = Field(None, pattern=ENTRYPOINT_PATTERN,
                                 description="'package.module:train_func', called once per rank with `config`")
    config: dict[str, Any] = Field(default_factory=dict, description="function: its one argument")
    working_dir: str | None = Field(None, description="the program's code: a local directory (trainyard run, "
                                                      "trainyard submit zips it) or a 'code:<sha256>' reference "
                                                      "from POST /v1/code")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables of every rank")
    grace_period_s: float = Field(30.0, gt=0.0, le=3600.0,
                                  description="after a cancel or preemption, how long should_stop() is True "
                                              "before the processes are killed (SIGTERM, then SIGKILL)")
