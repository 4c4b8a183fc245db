"""All service settings: one pydantic-settings object read from TRAINYARD_* variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.storage import Storage


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINYARD_", extra="ignore")

    home: Path = Path(".trainyard")
    database_url: str = ""  # empty = SQLite under home
    ray_address: str = ""  # empty = start a local Ray
    storage_uri: str = ""  # checkpoints and artefacts; empty = home/storage
    admin_token: str = ""
    allow_fault_injection: bool = False
    ray_num_cpus: int = 8  # logical CPUs of a local Ray (more than physical, so small jobs fit)

    # --- control plane (trainyard serve) ---
    host: str = "127.0.0.1"
    port: int = Field(8600, ge=0, le=65535)
    max_body_bytes: int = 1_000_000  # larger request bodies get 413
    max_code_bytes: int = Field(64 * 2**20, ge=1)  # POST /v1/code: a program's zipped working_dir; larger get 413
    max_active_jobs_per_tenant: int = 10_000  # QUEUED + running jobs; more get 429
    scheduler_enabled: bool = True  # false = accept jobs but keep them QUEUED (maintenance, benchmarks)
    control_loops: bool = True  # false = an API-only replica: no scheduler or reconciler here
    loop_interval_s: float = 0.5  # scheduler and reconciler tick
    # a node lost this recently may come back: a job that needs it queues instead of "can never run"
    node_return_grace_s: float = Field(300.0, ge=0)
    lease_ttl_s: float = 10.0  # the leader replica's lease; another replica takes over this long after it dies
    metrics_max_points: int = 2000  # per-step metrics kept per job; longer jobs are downsampled
    access_log: bool = False
    warm_workers: int = 4  # size of the cluster's warm pool of rank workers (0 = none); CPU jobs take from it
    standby_supervisors: int = 1  # idle supervisors kept started so a job starts at once
    # Where supervisors run: a custom Ray resource they each ask a sliver of (the Helm chart gives it to
    # the head, so they never share a GPU node with ranks, nor pile up on one node by chance); empty = anywhere
    supervisor_resource: str = Field("", pattern=r"^[A-Za-z0-9_.:-]*$")
    supervisor_memory_mb: int = Field(0, ge=0)  # Ray memory reserved per supervisor; 0 = none reserved
    api_threads: int = Field(4, ge=1)  # threads for the API's blocking database calls (per process)
    api_workers: int = Field(1, ge=1)  # processes answering the API (`trainyard serve --workers`); about one per core
    # a read that meets the database down or restarting tries again (0.1 s, doubling to 1 s) for this long,
    # then answers 503 with Retry-After (a write: 503 at once; api/http/database_outage.py); pg_ctl restart: 1-4 s
    db_unavailable_wait_s: float = Field(10.0, ge=0)
    metrics_retention_s: float = 600.0  # a finished job's live series (per rank, stage, event) are kept this long
    # true = a tenant's queued job that cannot be admitted checkpoints and requeues the tenant's
    # lower-priority running jobs (never another tenant's)
    preemption: bool = False
    # a queued job that does not fit waits this long while smaller jobs start past it (backfill); then
    # free capacity is held for it until it starts (service/queueing/policy.py). 300 s lets short gaps
    # fill with small jobs (a supervisor starts in seconds, a job's first checkpoint comes in minutes),
    # yet bounds a big job's extra wait to minutes; 0 = hold capacity for the first job that does not fit at
    # once (the jobs behind it use only what lies beyond its demand).
    # A tenant's own reserve_after_s overrides it.
    reserve_after_s: float = Field(300.0, ge=0)
    peak_flops_per_worker: float = 0.0  # hardware peak FLOP/s of one worker; > 0 exports trainyard_job_mfu_ratio

    # --- auth and abuse limits ---
    # a token checked this recently is trusted: bounds how late other replicas see a revocation
    auth_cache_s: float = 2.0
    rate_limit_per_s: float = 0.0  # requests per second per token (token bucket); 0 = no limit
    rate_limit_burst: int = 20  # bucket size: requests a token may send at once before 429s
    request_read_timeout_s: float = 10.0  # a request head not received by then: hang up; a body: 408
    keep_alive_timeout_s: float = 5.0  # idle keep-alive connections are closed after this

    @field_validator("storage_uri")
    @classmethod
    def _known_scheme(cls, uri: str) -> str:
        if uri:
            Storage.at(uri)  # ValueError naming the scheme or the missing bucket
        return uri

    @property
    def sqlite_path(self) -> Path:
        return (self.home / "trainyard.db").resolve()

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.sqlite_path}"

    @property
    def admin_token_file(self) -> Path:
        return (self.home / "admin-token").resolve()

    @property
    def storage_root(self) -> Path:
        """The storage as a local directory; ValueError on an object store (callers move to `storage`)."""
        return self.storage.local_path

    @property
    def storage(self) -> Storage:
        """Where jobs keep their files: a local directory or an object store (s3://, gs://)."""
        return Storage.at(self.storage_uri) if self.storage_uri else Storage.at(self.home / "storage")

    def job_storage(self, job_id: str) -> Storage:
        return self.storage / f"jobs/{job_id}"

    def job_dir(self, job_id: str) -> Path:
        return self.storage_root / "jobs" / job_id


class InvalidSettings(ValueError):
    """One line per invalid variable, named as the user sets it (every CLI command prints them)."""

    def __init__(self, lines: list[str]):
        super().__init__("; ".join(lines))
        self.lines = lines


@lru_cache
def get_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        raise InvalidSettings([f"{Settings.model_config['env_prefix']}{'.'.join(map(str, e['loc'])).upper()}: "
                               f"{e['msg']} (got {e['input']!r})" for e in exc.errors()]) from None
