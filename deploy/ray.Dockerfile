# syntax=docker/dockerfile:1
# Ray head and worker image, CPU: Ray, torch and Trainyard's code (the supervisor and worker
# actors import service/ and workers/). KubeRay runs `ray start` in it. Build from the repo root:
#   docker build -f deploy/ray.Dockerfile -t trainyard/ray:0.1.0 \
#     --build-arg TORCH_INDEX_URL=<a CPU-only torch wheel index> .
# Without TORCH_INDEX_URL the default torch wheel (with CUDA libraries) is used; it runs on CPU too.
# The versions must equal the pins in pyproject.toml (tests/deploy/test_dockerfiles.py checks).
ARG PYTHON_VERSION=3.11
ARG RAY_VERSION=2.60.0
ARG TORCH_VERSION=2.13.0

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG RAY_VERSION
ARG TORCH_VERSION
ARG TORCH_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
RUN pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api api
COPY service service
COPY workers workers
# ray[default]: the dashboard, agent, autoscaler and Ray Client server a KubeRay head runs.
# .[tracking]: MLflow and TensorBoard, which the per-job supervisor (a Ray actor) logs to.
RUN pip install .[tracking] "ray[default,train]==${RAY_VERSION}"

FROM python:${PYTHON_VERSION}-slim-bookworm
# KubeRay's default probes call wget; `ray start` runs under bash. No compilers.
RUN apt-get update && apt-get install -y --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --gid 100 --create-home --shell /bin/bash ray
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
USER 1000:100
WORKDIR /home/ray
