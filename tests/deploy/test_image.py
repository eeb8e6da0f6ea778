"""The image recipe (docker/Dockerfile) and what deploys it agree: the manifests name the image
scripts/build_image.sh tags, its Ray is the Ray this project pins and the RayService declares,
and it installs the extras the cluster's config needs. No Docker here: read, not built (the
recipe is linted by hadolint in scripts/test.sh)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.support.helpers import REPO

DOCKERFILE = (REPO / "docker" / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
BASE = re.compile(
    r"^ARG RAY_IMAGE=rayproject/ray:(?P<ray>[\d.]+)-py(?P<py>\d)(?P<minor>\d+)-cu(?P<cuda>\d+)$",
    re.M,
)


def manifests() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted((REPO / "k8s").glob("*.yaml"))
        # What `kubectl apply` takes: not the template, nor the Serve config overrides.
        if path.name not in ("rayservice.template.yaml", "serve_overrides.yaml")
        for doc in yaml.safe_load_all(path.read_text())
    ]


def containers(node: Any) -> list[dict[str, Any]]:
    """Every container spec anywhere in a manifest."""
    if isinstance(node, dict):
        found = [c for c in node.get("containers", []) if isinstance(c, dict)]
        return found + [c for value in node.values() for c in containers(value)]
    if isinstance(node, list):
        return [c for item in node for c in containers(item)]
    return []


def built_image() -> str:
    result = subprocess.run(
        [str(REPO / "scripts" / "build_image.sh"), "--print-tag"],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def test_the_manifests_run_the_image_the_script_builds() -> None:
    image = built_image()
    assert image.endswith(":" + PYPROJECT["version"])
    ours = [c["image"] for doc in manifests() for c in containers(doc) if "serve-app" in c["image"]]
    # The RayService's head and GPU workers, and the model download Job.
    assert len(ours) == 3 and set(ours) == {image}


def test_the_base_image_is_the_ray_and_python_the_project_pins() -> None:
    base = BASE.search(DOCKERFILE)
    assert base, "docker/Dockerfile names no rayproject/ray:VERSION-pyXY-cuNNN"
    (ray,) = [Requirement(r) for r in PYPROJECT["dependencies"] if r.startswith("ray[")]
    assert base["ray"] in ray.specifier
    python = f"{base['py']}.{base['minor']}"
    assert python in SpecifierSet(PYPROJECT["requires-python"])
    (rayservice,) = [doc for doc in manifests() if doc["kind"] == "RayService"]
    assert rayservice["spec"]["rayClusterConfig"]["rayVersion"] == base["ray"]
    # vLLM 0.33's torch 2.14 wheels are CUDA 13.0 builds: a CUDA 12 base would not run them.
    assert base["cuda"] == "130"


def test_the_image_installs_the_extras_the_cluster_configs_need() -> None:
    """One image for both RayServices (k8s/rayservice.yaml and k8s/shared-kv/): vLLM, asyncpg
    for the PostgreSQL store, and LMCache for the shared tier's connector, all in one install
    (scripts/image_install_check.py reads that line too)."""
    (extras,) = re.findall(r'pip install --no-cache-dir "/tmp/serve_app\[([\w,-]+)\]"', DOCKERFILE)
    installed = set(extras.split(","))
    assert installed <= set(PYPROJECT["optional-dependencies"])
    needed = set()
    for path in (REPO / "k8s" / "rayservice.yaml", REPO / "k8s" / "shared-kv" / "rayservice.yaml"):
        (rayservice,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
        engine = app["args"]["engine"]
        if engine["kind"] == "vllm":
            needed.add("vllm")
        transfer = engine["options"].get("kv_transfer_config") or {}
        if transfer.get("kv_connector") == "LMCacheConnectorV1":
            needed.add("shared-kv")  # vLLM's LMCacheConnectorV1 imports lmcache
        store_urls = {
            var["value"]
            for container in containers(rayservice)
            for var in container.get("env", [])
            if var["name"] == "SERVE_APP_STORE_URL"
        }
        if any(url.startswith("postgresql+asyncpg://") for url in store_urls):
            needed.add("postgres")  # asyncpg
    assert needed == installed == {"vllm", "postgres", "shared-kv"}


def test_the_image_installs_its_packages_in_one_resolution() -> None:
    """Two pip installs resolve apart: the second (LMCache, whose caps on protobuf, numpy,
    OpenTelemetry and prometheus-client are under what vLLM's set resolved to) downgrades what
    the first chose and leaves its dependants broken (`pip check` failed the build: issue 47).
    One install line, then pip check; LMCache comes in as the `shared-kv` extra, pinned."""
    code = "\n".join(line for line in DOCKERFILE.splitlines() if not line.startswith("#"))
    installs = re.findall(r"\bpip install\b[^\n]*", code)
    assert len(installs) == 1, installs
    assert re.search(r"\bpip check\b", code)
    (lmcache,) = [Requirement(r) for r in PYPROJECT["optional-dependencies"]["shared-kv"]]
    assert lmcache.name == "lmcache" and str(lmcache.specifier).startswith("==")


def test_the_install_check_reads_the_dockerfile_and_checks_as_pip_check_does() -> None:
    """scripts/image_install_check.py (a stage of scripts/test.sh; it needs the index): the
    command it resolves is the Dockerfile's line for the image's platform, and its pip check
    finds an unmet requirement, a version out of range and two builds of one module."""
    import sys

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import image_install_check as checker
    finally:
        sys.path.pop(0)
    extras = checker.install_extras(DOCKERFILE)
    # ray[all] declares cupy's CUDA 12 build, LMCache needs the CUDA 13 one: one `cupy` module,
    # so the base image's goes before the install (the check then leaves it out).
    assert checker.uninstalled_first(DOCKERFILE) == ["cupy-cuda12x"]
    command = checker.pip_command(REPO / "report.json", "3.11", "2.60.0", extras)
    assert "--dry-run" in command and "--only-binary=:all:" in command
    assert command[-2:] == ["ray[all]==2.60.0", f"{REPO}[vllm,postgres,shared-kv]"]
    tags = [command[i + 1] for i, arg in enumerate(command) if arg == "--platform"]
    assert "manylinux_2_39_x86_64" in tags and "manylinux_2_40_x86_64" not in tags

    def dist(name: str, version: str, *requires: str) -> dict:
        return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}

    clean = [
        dist("vllm", "0.33.0", "protobuf>=5.29.6", "nvtx==0.2.15; platform_system == 'Darwin'"),
        dist("protobuf", "6.33.6"),
        dist("lmcache", "0.5.6", "protobuf<7,>=6.31.1", "nixl>=1; extra == 'nixl'"),
    ]
    assert checker.check(clean, "3.11") == []
    broken = [
        *clean,
        dist("grpcio-reflection", "1.85.1", "protobuf<8.0.0,>=7.31.1"),
        dist("opentelemetry-sdk", "1.45.2", "opentelemetry-api==1.45.2"),
        dist("cupy-cuda12x", "14.0.0"),
        dist("cupy-cuda13x", "14.2.0"),
    ]
    problems = checker.check(broken, "3.11")
    assert len(problems) == 3, problems
    assert "grpcio-reflection 1.85.1 has requirement protobuf<8.0.0,>=7.31.1" in problems[0]
    assert "opentelemetry-api, not installed" in problems[1]
    assert "cupy-cuda12x and cupy-cuda13x" in problems[2]
