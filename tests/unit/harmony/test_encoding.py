"""The harmony encoding loads offline, from the vocab a pip-installed package ships."""

from __future__ import annotations

import os
import subprocess
import sys


def test_encoding_loads_with_an_empty_cache_and_no_vocab_configured(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_ENCODINGS_BASE"}
    env["SERVE_APP_CACHE_DIR"] = str(tmp_path)
    # Any download attempt fails fast: no proxy answers at this address.
    env["HTTPS_PROXY"] = env["HTTP_PROXY"] = "http://127.0.0.1:9"
    code = (
        "from serve_app.harmony.encoding import get_encoding;"
        "e = get_encoding();"
        "print(sorted(e.stop_tokens_for_assistant_actions()))"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[200002, 200012]"
    assert (tmp_path / "serve_app" / "tiktoken" / "o200k_base.tiktoken").is_file()
