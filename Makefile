VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: install lint test test-all test-fast bench clean prometheus

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Re-install only when the project metadata changes.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[dev,hf,tracking]'
	touch $(STAMP)

install: $(STAMP)

# The real Prometheus server and promtool (Debian package) for the observability tests.
prometheus:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus; }

# Lint and import order (ruff) on api/, service/, workers/ and trainyard/; types (mypy, configured in pyproject.toml) on all but api/.
lint: install
	$(VENV)/bin/ruff check api service workers trainyard
	$(VENV)/bin/mypy service workers trainyard

# Timing tests first, alone, while the machine is quiet; then everything else. Both always run.
# The full layout matrices (marker `exhaustive`) run in test-all, before an issue is resolved.
# The 25 slowest tests are listed at the end, so that every CI log says where the time goes.
test: lint install prometheus
	$(VENV)/bin/pytest -q -m timing; timing=$$?; \
	$(VENV)/bin/pytest -q --durations=25 -m "not timing and not exhaustive"; rest=$$?; \
	exit $$(( timing || rest ))

test-all: lint install prometheus
	$(VENV)/bin/pytest -q -m timing; timing=$$?; \
	$(VENV)/bin/pytest -q -m "not timing"; rest=$$?; \
	exit $$(( timing || rest ))

test-fast: install prometheus
	$(VENV)/bin/pytest -q -m "not slow and not exhaustive"

bench: install
	$(PY) bench/ddp_overhead.py

# Subnetwork data parallelism vs DDP (docs/sdp.md): memory, comm, throughput, loss at matched steps/FLOPs.
.PHONY: bench-sdp
bench-sdp: install
	$(PY) bench/sdp.py

# File data loader vs a plain PyTorch DataLoader loop: samples/s and memory as the dataset grows (docs/data.md).
.PHONY: bench-data
bench-data: install
	$(PY) bench/data.py

# One unmodified torchrun script run by torchrun, `trainyard run`, Ray Train and Ray Jobs (docs/programs-bench.md).
.PHONY: bench-programs
bench-programs: install
	$(PIP) install --quiet -e '.[bench]'
	$(PY) bench/programs.py

# PNG plots of the dashboards' queries from a real Prometheus scraping a live service (docs/img/).
.PHONY: dashboards-preview
dashboards-preview: install prometheus
	$(PIP) install --quiet -e '.[bench]'
	$(PY) bench/dashboards_preview.py --out docs/img

clean:
	rm -rf $(VENV) .trainyard .pytest_cache

# --- control plane -------------------------------------------------------------
.PHONY: demo serve

# Start the service (SQLite + local Ray under TRAINYARD_HOME), submit examples/ over REST,
# follow them live, print a summary and stop the service.
demo: install
	$(PY) -m api.cli.demo

# The service in the foreground: REST on TRAINYARD_HOST:TRAINYARD_PORT (127.0.0.1:8600).
serve: install
	$(VENV)/bin/trainyard serve
