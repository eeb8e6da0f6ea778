"""Write k8s/rayservice.yaml: the template with configs/gpt-oss.yaml embedded as serveConfigV2.

python k8s/render.py
"""

from __future__ import annotations

from pathlib import Path

K8S = Path(__file__).resolve().parent
CONFIG = K8S.parent / "configs" / "gpt-oss.yaml"


def render() -> str:
    template = (K8S / "rayservice.template.yaml").read_text()
    indent = " " * 4
    block = "".join(
        f"{indent}{line}\n" if line else "\n" for line in CONFIG.read_text().splitlines()
    )
    return template.replace("serveConfigV2: SERVE_CONFIG\n", f"serveConfigV2: |\n{block}")


if __name__ == "__main__":
    (K8S / "rayservice.yaml").write_text(render())
