"""The `tracking` section: where a job's params, per-step metrics and exported model are also logged.

The supervisor logs them (service/tracking/), never the ranks: one MLflow run per job, kept across
restarts, and TensorBoard event files in the job's storage directory. A tracking server that is
down never fails or stalls training.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, field_validator

from workers.spec.base import Strict

TRACKING_URI_SCHEMES = ("http", "https")


class MlflowTrackingSpec(Strict):
    tracking_uri: str = Field(description="the MLflow tracking server, http(s)://host:port")
    experiment: str = Field("Default", min_length=1, max_length=250,
                            description="the experiment the job's run goes to (created when missing)")
    run_name: str | None = Field(None, min_length=1, max_length=250,
                                 description="the run's name; default the job's name and id")
    tags: dict[str, str] = Field(default_factory=dict, description="tags set on the run")

    @field_validator("tracking_uri")
    @classmethod
    def _http_server(cls, uri: str) -> str:
        # Only a tracking server: a file store or database URI would make the supervisor's node
        # write wherever it happens to run.
        parts = urlsplit(uri)
        if parts.scheme not in TRACKING_URI_SCHEMES or not parts.hostname:
            raise ValueError(f"must be an http:// or https:// URL of an MLflow tracking server (got {uri!r})")
        try:
            parts.port  # noqa: B018 - raises on a port that is no number or out of range
        except ValueError as exc:
            raise ValueError(f"has an invalid port ({uri!r})") from exc
        return uri.rstrip("/")

    @field_validator("tags")
    @classmethod
    def _tag_keys(cls, tags: dict[str, str]) -> dict[str, str]:
        for key in tags:
            if not key or len(key) > 250:
                raise ValueError(f"tag names must have 1 to 250 characters (got {key!r})")
            if key.startswith("mlflow."):
                raise ValueError(f"tag {key!r}: names starting with 'mlflow.' are MLflow's own")
        return tags


class TrackingSpec(Strict):
    mlflow: MlflowTrackingSpec | None = Field(None, description="log to an MLflow tracking server")
    tensorboard: bool = Field(False, description="write TensorBoard event files under <job dir>/tensorboard/")

    @property
    def enabled(self) -> bool:
        return self.mlflow is not None or self.tensorboard
