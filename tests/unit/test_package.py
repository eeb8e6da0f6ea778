"""The package as a whole: no module a reader has to hold in their head at once."""

from __future__ import annotations

from tests.support import REPO

MAX_MODULE_LINES = 500


def test_no_module_is_over_500_lines() -> None:
    modules = sorted((REPO / "serve_app").rglob("*.py"))
    assert len(modules) > 50  # found the package, not nothing
    too_long = {
        str(path.relative_to(REPO)): lines
        for path in modules
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not too_long, f"split these by concern: {too_long}"
