# syntax=docker/dockerfile:1
# Trainyard control plane: `trainyard serve` (REST API, scheduler, reconciler), a Ray Client
# driver of the cluster. Build from the repository root:
#   docker build -f deploy/control-plane.Dockerfile -t trainyard/control-plane:0.1.0 .
# The versions must equal the pins in pyproject.toml (tests/deploy/test_dockerfiles.py checks):
# a Ray Client only talks to a cluster of the same Ray and Python version.
ARG PYTHON_VERSION=3.11
ARG RAY_VERSION=2.60.0
ARG TORCH_VERSION=2.13.0

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG RAY_VERSION
ARG TORCH_VERSION
# Optional extra index for torch wheels, e.g. a CPU-only one (the control plane never trains).
ARG TORCH_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
RUN pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api api
COPY service service
COPY workers workers
# psycopg: the PostgreSQL driver of the production path (postgresql+psycopg:// URLs).
RUN pip install . "ray[client,train]==${RAY_VERSION}" "psycopg[binary]"

FROM python:${PYTHON_VERSION}-slim-bookworm
RUN useradd --uid 1000 --gid 100 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin trainyard \
    && mkdir -p /var/lib/trainyard && chown 1000:100 /var/lib/trainyard
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    TRAINYARD_HOME=/var/lib/trainyard TRAINYARD_HOST=0.0.0.0 TRAINYARD_PORT=8600
USER 1000:100
EXPOSE 8600
ENTRYPOINT ["trainyard"]
CMD ["serve"]
