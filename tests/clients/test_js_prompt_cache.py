"""The openai JS SDK reads ``prompt_cache_diagnostics``: every reason the app can show, a hit, a
comparison not found and a stream's events (tests/js/prompt_cache_scenarios.mjs ``reasons``;
the Python SDK's: tests/app/test_prompt_cache_diagnostics.py)."""

from __future__ import annotations

from tests.support import js_scenarios

# Settings the cache is keyed by leave nothing reusable; the others count from the divergence.
KEYED = {"prompt_cache_key_changed", "verbosity_changed", "service_tier_changed"}


def test_the_js_sdk_gets_each_reason(app_url: str) -> None:
    result = js_scenarios.run("prompt_cache_scenarios.mjs", "reasons", app_url)["result"]
    for expected, diagnostics in result["reasons"].items():
        assert diagnostics["type"] == "cache_miss", (expected, diagnostics)
        assert diagnostics["reason"] == expected
        assert diagnostics["missed"] + diagnostics["reusable"] == diagnostics["input"]
        if expected in KEYED:
            assert diagnostics["reusable"] == 0
        else:
            assert 0 < diagnostics["reusable"] < result["baselineTokens"]
    assert result["compaction"]["reason"] == "context_compacted"
    assert result["hit"] == {"type": "cache_hit"}
    assert result["notFound"] == {"type": "comparison_response_not_found"}
    streamed = result["streamed"]
    assert streamed[0][0] == "response.created" and streamed[-1][0] == "response.completed"
    assert {reason for _, reason in streamed} == {"reasoning_effort_changed"}
