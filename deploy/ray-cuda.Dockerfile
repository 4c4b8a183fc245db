# syntax=docker/dockerfile:1
# Ray head and worker image, CUDA: as ray.Dockerfile, with the default torch wheel, which
# brings its CUDA and NCCL libraries; the node's NVIDIA container runtime adds the driver.
#   docker build -f deploy/ray-cuda.Dockerfile -t trainyard/ray-cuda:0.1.0 .
# The versions must equal the pins in pyproject.toml (tests/deploy/test_dockerfiles.py checks).
ARG PYTHON_VERSION=3.11
ARG RAY_VERSION=2.60.0
ARG TORCH_VERSION=2.13.0

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG RAY_VERSION
ARG TORCH_VERSION
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
RUN pip install "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api api
COPY service service
COPY workers workers
# .[tracking]: MLflow and TensorBoard, which the per-job supervisor (a Ray actor) logs to.
RUN pip install .[tracking] "ray[default,train]==${RAY_VERSION}"

FROM python:${PYTHON_VERSION}-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --gid 100 --create-home --shell /bin/bash ray
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 1000:100
WORKDIR /home/ray
