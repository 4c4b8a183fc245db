"""All service settings: one pydantic-settings object read from TRAINYARD_* variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINYARD_", extra="ignore")

    home: Path = Path(".trainyard")
    database_url: str = ""  # empty = SQLite under home
    ray_address: str = ""  # empty = start a local Ray
    storage_uri: str = ""  # checkpoints and artefacts; empty = home/storage
    admin_token: str = ""
    allow_fault_injection: bool = False
    ray_num_cpus: int = 8  # logical CPUs of a local Ray (more than physical, so small jobs fit)

    @property
    def storage_root(self) -> Path:
        root = Path(self.storage_uri.removeprefix("file://")) if self.storage_uri else self.home / "storage"
        return root.resolve()

    def job_dir(self, job_id: str) -> Path:
        return self.storage_root / "jobs" / job_id


@lru_cache
def get_settings() -> Settings:
    return Settings()
