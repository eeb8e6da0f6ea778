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


def test_the_image_installs_the_extras_the_cluster_config_needs() -> None:
    (extras,) = re.findall(r'pip install --no-cache-dir "/tmp/serve_app\[([\w,]+)\]"', DOCKERFILE)
    installed = set(extras.split(","))
    assert installed <= set(PYPROJECT["optional-dependencies"])
    (rayservice,) = [doc for doc in manifests() if doc["kind"] == "RayService"]
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    needed = {"vllm"} if app["args"]["engine"]["kind"] == "vllm" else set()
    store_urls = {
        var["value"]
        for container in containers(rayservice)
        for var in container.get("env", [])
        if var["name"] == "SERVE_APP_STORE_URL"
    }
    if any(url.startswith("postgresql+asyncpg://") for url in store_urls):
        needed.add("postgres")  # asyncpg
    assert needed == installed
