"""Write k8s/rayservice.yaml: the template with the cluster's Serve config embedded as
serveConfigV2: configs/gpt-oss.yaml with k8s/serve_overrides.yaml merged in; and with
configs/fast-path.env (Ray's fast path: HAProxy, direct ingress) in every Ray container's env.

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
HEADER = (
    "# configs/gpt-oss.yaml with k8s/serve_overrides.yaml merged in, by k8s/render.py: the\n"
    "# comments of both explain the values.\n"
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


def serve_config() -> dict[str, Any]:
    """The cluster's Serve config."""
    return merge(yaml.safe_load(CONFIG.read_text()), yaml.safe_load(OVERRIDES.read_text()))


def fast_path_env() -> list[dict[str, str]]:
    """configs/fast-path.env as a container's env entries."""
    return [{"name": name, "value": value} for name, value in read_env_file().items()]


def render() -> str:
    template = (K8S / "rayservice.template.yaml").read_text()
    text = HEADER + yaml.safe_dump(serve_config(), sort_keys=False, width=100)
    block = "".join(f"    {line}\n" if line else "\n" for line in text.splitlines())
    rendered = template.replace("serveConfigV2: SERVE_CONFIG\n", f"serveConfigV2: |\n{block}")
    (marker,) = [line for line in rendered.splitlines(keepends=True) if "- FAST_PATH_ENV" in line]
    indent = marker[: marker.index("-")]
    entries = "".join(
        f"{indent}- {{name: {entry['name']}, value: {json.dumps(entry['value'])}}}\n"
        for entry in fast_path_env()
    )
    return rendered.replace(marker, entries)


if __name__ == "__main__":
    (K8S / "rayservice.yaml").write_text(render())
