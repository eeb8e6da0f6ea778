"""Does the image's install line resolve, and would `pip check` pass in the image? Checked with
no container runtime: pip resolves docker/Dockerfile's install line for the image's platform
(`pip install --dry-run --ignore-installed --report`, wheels only, the base image's Python and
manylinux tags up to its glibc), together with the Ray the base image ships, and reads no wheel
but their metadata; then the resolved set is checked as `pip check` checks an environment (each
distribution's requirements, markers evaluated for the image) and for two distributions of one
module.

    python scripts/image_install_check.py          # scripts/test.sh runs it as a stage of its own

What it checks and what it does not (docs/deploy.md, "The image"):
- checked: one resolution exists for `ray[all]==<the base image's Ray>` and
  `.[<the Dockerfile's extras>]` (vLLM with its exact torch and CUDA wheel pins, LMCache,
  asyncpg) with wheels for CPython 3.11 on manylinux x86-64 (glibc <= 2.39, the base image's
  Ubuntu 24.04); every requirement of every resolved distribution is met within the set; no
  two resolved distributions install the same top-level module (cupy's CUDA builds: the
  Dockerfile uninstalls the CUDA 12 build `ray[all]` declares before it installs, and the
  check leaves out what it uninstalls);
- not checked: the base image's own package list beyond what `ray[all]` declares (pip, in the
  image, keeps what is installed where it can, so it may choose other versions than this fresh
  resolution), that the wheels install and their compiled parts load against the image's CUDA
  13.0 and driver (only a build and a GPU run show that).

Exit status: 0 resolved and clean, or skipped (the index cannot be reached: said on stdout); 1
a conflict (pip's resolver error, or the check's findings, printed).
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "docker" / "Dockerfile"
# The base image's glibc: rayproject/ray 2.60's images are Ubuntu 24.04 (glibc 2.39); pip takes
# a wheel of any manylinux tag up to it.
GLIBC = (2, 39)
# Distributions that install the same top-level module: one of each group at most.
ONE_OWNER = {
    "cupy": re.compile(r"^cupy-cuda\d+x?$"),
    "openai_harmony": re.compile(r"^(openai-harmony|oss-harmony)$"),
}
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish|Temporary failure in name resolution|"
    r"ConnectTimeoutError|Max retries exceeded|No route to host|Network is unreachable"
)


def base_image() -> dict[str, str]:
    """The Ray version and Python of the Dockerfile's base image (`ARG RAY_IMAGE=...`)."""
    found = re.search(
        r"^ARG RAY_IMAGE=rayproject/ray:(?P<ray>[\d.]+)-py(?P<major>\d)(?P<minor>\d+)-cu\d+$",
        DOCKERFILE.read_text(),
        re.M,
    )
    if not found:
        raise SystemExit("docker/Dockerfile names no rayproject/ray:VERSION-pyXY-cuNNN base")
    return {"ray": found["ray"], "python": f"{found['major']}.{found['minor']}"}


def install_extras(dockerfile: str) -> list[str]:
    """The extras of the Dockerfile's one install of this repository: `pip install ...
    "/tmp/serve_app[a,b]"`. More than one pip install of packages is an error: two steps are
    resolved apart, and the second can break what the first chose (issue 47)."""
    code = "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    installs = re.findall(r"\bpip install\b[^\n]*", code)
    ours = [line for line in installs if "/tmp/serve_app[" in line]
    if len(installs) != 1 or len(ours) != 1:
        raise SystemExit(f"docker/Dockerfile: one pip install of the repository wanted: {installs}")
    (extras,) = re.findall(r"/tmp/serve_app\[([\w,-]+)\]", ours[0])
    return extras.split(",")


def uninstalled_first(dockerfile: str) -> list[str]:
    """The distributions the Dockerfile uninstalls before its install (`pip uninstall -y ...`):
    the base image's, replaced by the install's."""
    code = "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    install = code.index("pip install")
    return [
        name
        for found in re.finditer(r"\bpip uninstall -y ([\w. -]+?)\s*(?:\\|&&|$)", code, re.M)
        if found.start() < install
        for name in found.group(1).split()
    ]


def platforms(glibc: tuple[int, int] = GLIBC) -> list[str]:
    """Every manylinux x86-64 tag a pip on that glibc accepts."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(17, minor + 1)]
    return [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def pip_command(report: Path, python: str, ray: str, extras: Iterable[str]) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report),
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        f"cp{python.replace('.', '')}",
    ]
    for tag in platforms():
        command += ["--platform", tag]
    return [*command, f"ray[all]=={ray}", f"{REPO}[{','.join(extras)}]"]


def environment(python: str) -> dict[str, str]:
    """The image's marker environment (Linux, x86-64, CPython ``python``). Its patch release is
    this interpreter's when the minor versions agree (pip evaluated the markers with it while
    resolving, whatever --python-version says), else the latest (the base image's Python is
    a current 3.11)."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    full = platform.python_version() if here == python else f"{python}.99"
    return {
        "python_version": python,
        "python_full_version": full,
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "sys_platform": "linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": "",
    }


def check(installed: list[dict[str, Any]], python: str) -> list[str]:
    """What `pip check` would say of an environment of exactly these distributions (the
    report's `install` entries): each one's requirements (not its extras', as pip check),
    markers evaluated for the image; and modules two distributions would both install."""
    env = environment(python)
    versions = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in installed
    }
    problems = []
    for item in installed:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        for line in item["metadata"].get("requires_dist", []):
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate(env):
                continue
            have = versions.get(canonicalize_name(requirement.name))
            if have is None:
                problems.append(f"{name} {version} requires {requirement.name}, not installed")
            elif not requirement.specifier.contains(have, prereleases=True):
                problems.append(
                    f"{name} {version} has requirement {requirement}, but you have "
                    f"{requirement.name} {have}"
                )
    for module, owners in ONE_OWNER.items():
        found = sorted(name for name in versions if owners.match(name))
        if len(found) > 1:
            problems.append(f"{' and '.join(found)} all install the module {module!r}")
    return problems


def main() -> int:
    image = base_image()
    extras = install_extras(DOCKERFILE.read_text())
    defined = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    if not set(extras) <= defined:
        print(f"docker/Dockerfile installs extras pyproject.toml lacks: {set(extras) - defined}")
        return 1
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = pip_command(report, image["python"], image["ray"], extras)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            if UNREACHABLE.search(result.stderr):
                print(
                    "SKIPPED: the package index cannot be reached; the image's install line "
                    "was not checked"
                )
                return 0
            print("The image's install line does not resolve:")
            print(result.stderr[-6000:])
            return 1
        resolved = json.loads(report.read_text())["install"]
    # The image: what the base image ships (modelled by ray[all]) less what the Dockerfile
    # uninstalls first, with the install's resolution. A distribution removed so that another
    # still requires is found by the check ("not installed").
    removed = {canonicalize_name(name) for name in uninstalled_first(DOCKERFILE.read_text())}
    installed = [i for i in resolved if canonicalize_name(i["metadata"]["name"]) not in removed]
    problems = check(installed, image["python"])
    names = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installed}
    summary = ", ".join(
        f"{name} {names[name]}"
        for name in ("ray", "vllm", "torch", "lmcache", "protobuf", "numpy", "opentelemetry-api")
        if name in names
    )
    if problems:
        print(f"The image's install line resolves ({summary}) but pip check would fail:")
        print("\n".join(problems))
        return 1
    print(
        f"The image's install line resolves and passes pip check: {len(installed)} "
        f"distributions for CPython {image['python']} on manylinux x86-64 ({summary})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
