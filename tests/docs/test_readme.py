"""The README names only what exists: every path it gives (``serve_app/...``, ``configs/...``,
``docs/...``, ``loadtests/...``, ``scripts/...``, ``k8s/...``, ``tests/...``, ``docker/...``, and
the paths under ``serve_app/`` its map and walk give relative to it) is a file or folder here,
every file a link names exists and its section is a heading of that page (the pages of docs/ and
k8s/README.md too), and every code name of the map's diagram and of the walk ("Follow one
request") is defined where the README says it is (found with ``ast``): ``Name`` (``path``) in
that module, ``Class.method`` on that class, ``module.name`` in that module, a bare name
somewhere in serve_app (or, for the API's own words such as ``response.failed`` or
``server_error``, a string serve_app sends). And it stays a map: about 200 lines that open with
the start and test commands and name every page of docs/.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO

README = REPO / "README.md"
PACKAGE = REPO / "serve_app"
TOP_FOLDERS = ("serve_app", "configs", "docs", "loadtests", "scripts", "k8s", "tests", "docker")
# serve_app's subpackages: the map and the walk give paths under serve_app/ relative to it.
SUBPACKAGES = tuple(sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()))
# Names the diagram shows that are not this code base's (third-party classes, protocols).
NOT_OURS = frozenset({"FastAPI", "WebSocket"})
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
PATH_CHARS = r"[A-Za-z0-9_.*/-]"


# --- reading the README ------------------------------------------------------------------------


def section(text: str, title: str) -> str:
    """The text of the ``## title`` section of a page."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section {title!r}"
    return match.group(1)


def paths(text: str) -> Iterator[str]:
    """Every repository path the text gives: from the top (``docs/x.md``) or, for serve_app's
    subpackages, under serve_app/ (``serving/ingress.py``); ``./`` and anchors dropped."""
    top = "|".join(TOP_FOLDERS + SUBPACKAGES)
    for match in re.finditer(rf"(?<![\w/.$~-])(?:\./)?((?:{top})/{PATH_CHARS}*)", text):
        path = match.group(1).split("#")[0].rstrip(".,;:)")
        yield path if path.split("/")[0] in TOP_FOLDERS else f"serve_app/{path}"


def table_paths(text: str) -> Iterator[str]:
    """The files the map's table names relative to the folder of their row: ``requests.py``,
    ``turn/service.py``, ``codex/`` in the rows of ``serve_app/protocol/``,
    ``serve_app/serving/``, ``configs/``."""
    for row in re.findall(r"^\| `([\w/.-]+/)` \|(.*)\|$", text, re.M):
        folder, cells = row
        for name in re.findall(r"`([\w.-]+(?:/[\w.-]+)*(?:\.(?:py|yaml|json|md)|/))`", cells):
            if name.split("/")[0] not in TOP_FOLDERS + SUBPACKAGES:  # those: paths() has them
                yield folder + name


def links(page: Path) -> Iterator[tuple[str, Path, str]]:
    """(link, file, section) of each Markdown link of a page to a file of the repository, its
    path taken from the page's folder: ``(docs/x.md#anchor)``, ``(../k8s/README.md)``,
    ``(#anchor)`` (that page); the section is empty for a link to a whole file. Not code."""
    text = re.sub(r"```.*?```|`[^`\n]*`", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", target):  # not https:, mailto:
            path, _, anchor = target.partition("#")
            yield target, (page.parent / path).resolve() if path else page, anchor


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@dataclass(frozen=True)
class Claim:
    """A code name the README gives, and where it says it is (a path, or nothing said)."""

    name: str
    where: str | None
    context: str

    def __str__(self) -> str:
        return (
            f"`{self.name}`" + (f" in `{self.where}`" if self.where else "") + f": {self.context}"
        )


def diagram_claims(shape: str) -> Iterator[Claim]:
    """The diagram: each CamelCase name on a line that ends with a path is defined there."""
    block = re.search(r"```\n(.*?)```", shape, re.S)
    assert block, "the map has no diagram"
    for line in block.group(1).splitlines():
        trailing = re.search(rf"\s{{2,}}({'|'.join(SUBPACKAGES)})/{PATH_CHARS}*$", line)
        if not trailing:
            continue
        where = "serve_app/" + trailing.group(0).strip()
        for name in re.findall(r"\b[A-Z][a-z]+(?:[A-Z][a-z]*)+\b", line[: trailing.start()]):
            if name not in NOT_OURS:
                yield Claim(name, where, line.strip())


def walk_claims(walk: str) -> Iterator[Claim]:
    """The walk: every identifier in backquotes; ``Name`` (``path``...) says where it is."""
    for step in re.split(r"\n(?=\d+\. )", walk):
        for match in re.finditer(r"`([^`]+)`( \(`([^`]+)`)?", step):
            name, where = match.group(1), match.group(3)
            if not IDENTIFIER.fullmatch(name):
                continue  # `POST /v1/responses`, `truncation: "auto"`: not a name
            if where is not None and where.split("/")[0] in SUBPACKAGES:
                where = f"serve_app/{where}"
            else:
                where = None
            yield Claim(name, where, " ".join(step.split())[:90])


# --- reading the code --------------------------------------------------------------------------


@functools.cache
def modules() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def defined(tree: ast.AST) -> set[str]:
    """Every name a module defines, at any depth (nested functions too): functions, classes,
    assignments, imports (a name a module re-exports is there for its readers)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def class_members(tree: ast.AST, class_name: str) -> set[str] | None:
    """The methods and attributes of ``class_name`` if the module defines it, else None."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            members = defined(ast.Module(body=node.body, type_ignores=[]))
            for sub in ast.walk(node):  # self.x = ... in its methods
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                    members.add(sub.attr)
            return members
    return None


def strings(tree: ast.AST) -> set[str]:
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def in_scope(where: str | None) -> dict[Path, ast.Module]:
    """The modules a claim's place names: one module, every module under a folder, or all."""
    if where is None:
        return modules()
    target = REPO / where
    return {
        path: tree for path, tree in modules().items() if path == target or target in path.parents
    }


def problem(claim: Claim) -> str | None:
    """Why the claim is false, or None if it holds."""
    scope = in_scope(claim.where)
    if not scope:
        return f"{claim}: no module {claim.where}"
    first, _, rest = claim.name.partition(".")
    if rest:
        if first[0].isupper():  # Class.member
            for tree in scope.values():
                members = class_members(tree, first)
                if members is not None and rest.split(".")[0] in members:
                    return None
            return f"{claim}: no class {first} with {rest} there"
        named = [path for path in modules() if path.stem == first]
        if named:  # module.name
            if any(rest.split(".")[0] in defined(modules()[path]) for path in named):
                return None
            return f"{claim}: {first}.py defines no {rest}"
    elif any(claim.name in defined(tree) for tree in scope.values()):
        return None
    if claim.where is None and any(claim.name in strings(tree) for tree in scope.values()):
        return None  # the API's own word (an event type, an error code) that serve_app sends
    return f"{claim}: not defined there"


# --- the tests ---------------------------------------------------------------------------------


# The pages whose paths are checked too (their code names are not: no walk to read them in).
PAGES = [README, *sorted((REPO / "docs").glob("*.md")), REPO / "k8s" / "README.md"]
# Files a page's commands write, not in the repository.
WRITTEN_BY_COMMANDS = frozenset({"loadtests/traces/codex_200.jsonl"})


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_path_a_page_gives_exists(page: Path) -> None:
    text = page.read_text()
    given = set(paths(text)) | set(table_paths(text))
    if page == README:
        assert len(given) > 40  # the reader found the map's paths, not nothing
    missing = sorted(p for p in given - WRITTEN_BY_COMMANDS if not (REPO / p).exists())
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_file_and_section_a_page_links_to_exists(page: Path) -> None:
    found = list(links(page))
    if page == README:
        assert len(found) > 10  # the reader found the links, not nothing
    broken = [
        link
        for link, target, anchor in found
        if not target.exists() or (anchor and anchor not in anchors(target))
    ]
    assert not broken, f"{page.name} links to files or sections that do not exist: {broken}"


def test_the_readme_opens_with_the_start_and_the_test_command() -> None:
    """A fresh machine needs two commands: one installs what is missing and starts the app,
    one runs the tests."""
    first_block = re.search(r"```\w*\n(.*?)```", README.read_text(), re.S)
    assert first_block
    commands = [line.split("#", 1)[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["./scripts/start.sh", "./scripts/test.sh"]


def test_the_readme_is_a_map() -> None:
    """About 200 lines that name every page of docs/; the detail lives there."""
    text = README.read_text()
    assert len(text.splitlines()) <= 220
    unnamed = [
        doc.name for doc in sorted((REPO / "docs").glob("*.md")) if f"docs/{doc.name}" not in text
    ]
    assert not unnamed, f"README.md names no docs/{unnamed}"


@pytest.mark.parametrize("part", ["the map's diagram", "the walk"])
def test_every_code_name_is_where_the_readme_says(part: str) -> None:
    text = README.read_text()
    if part == "the walk":
        claims = list(walk_claims(section(text, "Follow one request")))
    else:
        claims = list(diagram_claims(section(text, "Shape")))
    assert len(claims) > 5  # the reader found the names, not nothing
    false = [reason for claim in claims if (reason := problem(claim)) is not None]
    assert not false, "README.md says what is not so:\n" + "\n".join(false)


def test_the_gpu_command_runs_production_closed_and_on_the_fast_path() -> None:
    """The "On GPUs" command (docs/deploy.md) starts what the README calls production: Ray's
    fast path (configs/fast-path.env exported before `serve run`) and API keys, without which
    configs/gpt-oss.yaml, listening on every interface, refuses to start."""
    gpu = section((REPO / "docs" / "deploy.md").read_text(), "On GPUs")
    (block,) = re.findall(r"```bash\n(.*?)```", gpu, re.S)[:1]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    run = next(i for i, line in enumerate(lines) if "serve run configs/gpt-oss.yaml" in line)
    before = lines[:run]
    assert "set -a; . configs/fast-path.env; set +a" in before, block
    assert any(line.startswith("export SERVE_APP_API_KEYS=") for line in before), block
