"""A real Prometheus server (the Debian package's binary) on loopback for tests and previews."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import yaml

from tests.live import free_port, wait_ready
from tests.observability.dashboards import RULES


class Prometheus:
    """A real Prometheus server on loopback, scraping one target every second, with our rules loaded."""

    def __init__(self, tmp_path, target: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            # honor_labels: the series' own `job` label (the Trainyard job id) wins over the scrape job's
            "scrape_configs": [{"job_name": "trainyard", "honor_labels": True, "metrics_path": "/metrics",
                                "static_configs": [{"targets": [target]}]}],
        }
        self.config = tmp_path / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.data, self.log = tmp_path / "tsdb", tmp_path / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Prometheus":
        binary = shutil.which("prometheus")
        assert binary, "prometheus missing: run `make prometheus` (apt-get install prometheus)"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.data}",
                                          f"--web.listen-address=127.0.0.1:{self.port}"],
                                         stdout=log, stderr=subprocess.STDOUT)
        wait_ready(self.proc, f"{self.url}/-/ready", self.log, "prometheus", 60)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def query(self, expr: str) -> list[dict]:
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = resp.json()
        assert resp.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def alerts(self) -> list[dict]:
        return httpx.get(f"{self.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]

    def rules_loaded(self) -> int:
        groups = httpx.get(f"{self.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        return sum(len(g["rules"]) for g in groups)

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict]:
        resp = httpx.get(f"{self.url}/api/v1/query_range",
                         params={"query": expr, "start": start, "end": end, "step": step}, timeout=30)
        body = resp.json()
        assert resp.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]
