"""Write k8s/rayservice.yaml: the template with the cluster's Serve config embedded as
serveConfigV2: configs/gpt-oss.yaml with k8s/serve_overrides.yaml merged in; and with
configs/fast-path.env (Ray's fast path: HAProxy, direct ingress) in every Ray container's env.
And k8s/shared-kv/rayservice.yaml, the same RayService with the shared KV tier:
configs/gpt-oss-shared-kv.yaml with k8s/serve_overrides.yaml, then
k8s/shared-kv/serve_overrides.yaml, merged in.

python k8s/render.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from serve_app.fast_path import read_env_file

K8S = Path(__file__).resolve().parent
CONFIG = K8S.parent / "configs" / "gpt-oss.yaml"
OVERRIDES = K8S / "serve_overrides.yaml"
# The shared KV tier's RayService (k8s/README.md): its config, and its overrides on top of ours.
SHARED_KV = K8S / "shared-kv"
SHARED_KV_CONFIG = K8S.parent / "configs" / "gpt-oss-shared-kv.yaml"
SHARED_KV_OVERRIDES = (OVERRIDES, SHARED_KV / "serve_overrides.yaml")


def _relative(path: Path) -> str:
    """A path as the header names it: from the repository (an overlay outside it, as a test
    renders one, by its full path)."""
    return str(path.relative_to(K8S.parent)) if path.is_relative_to(K8S.parent) else str(path)


def _header(config: Path, overrides: tuple[Path, ...]) -> str:
    merged = ", then ".join(_relative(path) for path in overrides)
    return (
        f"# {_relative(config)} with {merged} merged in, by k8s/render.py: the\n"
        "# comments of each explain the values.\n"
    )


def _named(items: list[Any]) -> bool:
    return all(isinstance(item, dict) and "name" in item for item in items)


def merge(base: Any, override: Any) -> Any:
    """``override`` over ``base``: mappings merge key by key, lists of named mappings (Serve's
    applications and deployments) entry by entry by name; anything else is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge(base[key], value) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(override, list) and _named(base) and _named(override):
        by_name = {item["name"]: item for item in override}
        unknown = set(by_name) - {item["name"] for item in base}
        if unknown:
            raise ValueError(f"overrides name entries the config does not have: {sorted(unknown)}")
        return [
            merge(item, by_name[item["name"]]) if item["name"] in by_name else item for item in base
        ]
    return override


def serve_config(
    config: Path = CONFIG, overrides: tuple[Path, ...] = (OVERRIDES,)
) -> dict[str, Any]:
    """The cluster's Serve config: ``config`` with each of ``overrides`` merged in, in order."""
    merged = yaml.safe_load(config.read_text())
    for path in overrides:
        merged = merge(merged, yaml.safe_load(path.read_text()))
    return merged


def fast_path_env() -> list[dict[str, str]]:
    """configs/fast-path.env as a container's env entries."""
    return [{"name": name, "value": value} for name, value in read_env_file().items()]


def render(config: Path = CONFIG, overrides: tuple[Path, ...] = (OVERRIDES,)) -> str:
    template = (K8S / "rayservice.template.yaml").read_text()
    text = _header(config, overrides) + yaml.safe_dump(
        serve_config(config, overrides), sort_keys=False, width=100
    )
    block = "".join(f"    {line}\n" if line else "\n" for line in text.splitlines())
    rendered = template.replace("serveConfigV2: SERVE_CONFIG\n", f"serveConfigV2: |\n{block}")
    (marker,) = [line for line in rendered.splitlines(keepends=True) if "- FAST_PATH_ENV" in line]
    indent = marker[: marker.index("-")]
    entries = "".join(
        f"{indent}- {{name: {entry['name']}, value: {json.dumps(entry['value'])}}}\n"
        for entry in fast_path_env()
    )
    return rendered.replace(marker, entries)


SHARED_KV_HEADER = (
    "# k8s/rayservice.yaml with the shared KV tier (configs/gpt-oss-shared-kv.yaml), rendered\n"
    "# by k8s/render.py: apply it instead of k8s/rayservice.yaml (same name), with\n"
    "# k8s/shared-kv/kv-server.yaml (k8s/README.md).\n"
)


def render_shared_kv() -> str:
    return SHARED_KV_HEADER + render(SHARED_KV_CONFIG, SHARED_KV_OVERRIDES)


if __name__ == "__main__":
    (K8S / "rayservice.yaml").write_text(render())
    (SHARED_KV / "rayservice.yaml").write_text(render_shared_kv())
