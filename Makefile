VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: install lint test test-all test-fast bench clean prometheus netns-tools browser

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Re-install only when the project metadata changes.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[dev,hf,tracking,storage]'
	touch $(STAMP)

install: $(STAMP)

# The real Prometheus server and promtool (Debian package) for the observability tests.
prometheus:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus; }

# Debian's chromium and its chromedriver for the web console's browser tests (tests/console/, selenium).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver; }

# iproute2 (`ip netns`) and util-linux (`unshare`, `nsenter`) for the share-nothing test bed (tests/sharenothing/, as root).
netns-tools:
	@command -v ip >/dev/null && command -v unshare >/dev/null && command -v nsenter >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq iproute2 util-linux; }

# Lint and import order (ruff) on api/, service/, workers/ and trainyard/; types (mypy, configured in pyproject.toml) on all but api/.
lint: install
	$(VENV)/bin/ruff check api service workers trainyard
	$(VENV)/bin/mypy service workers trainyard

# Timing tests first, alone, while the machine is quiet; then everything else. Both always run.
# The full layout matrices (marker `exhaustive`) run in test-all, before an issue is resolved.
# The 25 slowest tests are listed at the end, so that every CI log says where the time goes.
# A run that failed also names the test it was in (one that died gives no summary: tests/died_during.py).
test: lint install prometheus netns-tools browser
	export TRAINYARD_TEST_PROGRESS=$(CURDIR)/.pytest-progress; \
	$(VENV)/bin/pytest -q -m "timing and not exhaustive"; timing=$$?; \
	[ $$timing -eq 0 ] || $(VENV)/bin/python -m tests.died_during .pytest-progress $$timing; \
	$(VENV)/bin/pytest -q --durations=25 -m "not timing and not exhaustive"; rest=$$?; \
	[ $$rest -eq 0 ] || $(VENV)/bin/python -m tests.died_during .pytest-progress $$rest; \
	exit $$(( timing || rest ))

test-all: lint install prometheus netns-tools browser
	export TRAINYARD_TEST_PROGRESS=$(CURDIR)/.pytest-progress; \
	$(VENV)/bin/pytest -q -m timing; timing=$$?; \
	[ $$timing -eq 0 ] || $(VENV)/bin/python -m tests.died_during .pytest-progress $$timing; \
	$(VENV)/bin/pytest -q -m "not timing"; rest=$$?; \
	[ $$rest -eq 0 ] || $(VENV)/bin/python -m tests.died_during .pytest-progress $$rest; \
	exit $$(( timing || rest ))

test-fast: install prometheus netns-tools
	$(VENV)/bin/pytest -q -m "not slow and not exhaustive"

bench: install
	$(PY) bench/ddp_overhead.py

# Issue 21's device check: the worker side on one GPU from the source tree, no Ray, no install
# (bench/device_check.py; `--dry-run` builds every configuration and trains each 2 steps on CPU).
# The machine's own python3 (torch 2.11, no pydantic): pydantic comes from bench/wheels/.
.PHONY: device-check device-check-dry device-wheels
DEVICE_PY ?= python3
device-check:
	$(DEVICE_PY) bench/device_check.py

device-check-dry:
	$(DEVICE_PY) bench/device_check.py --dry-run

# The wheels the device machine lacks (cp312, x86_64 manylinux; ~2.8 MB), into the ignored bench/wheels/.
device-wheels: install
	$(PIP) download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d bench/wheels \
	  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0

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

# docs/spec.md, the job spec reference, from the schema's own descriptions (workers/spec/reference.py);
# tests/workers/test_spec_reference.py fails when the page is stale.
.PHONY: spec-reference
spec-reference: install
	$(PY) -m workers.spec.reference

# The fault soak (docs/ha.md): a private PostgreSQL, two replicas, a multi-node Ray, a job stream and a
# seeded chaos schedule for MINUTES; prints one table and fails unless every target is met.
.PHONY: soak
MINUTES ?= 30
SEED ?= 1
soak: install
	$(PY) -m bench.soak --minutes $(MINUTES) --seed $(SEED)

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
