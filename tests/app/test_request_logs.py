"""One request followed across replicas (docs/reliability.md, "Following one request"): its id
on every line the app logs about it, in the log file of each replica it touches, the ingress
replica's and the engine replica's. The id is Ray Serve's own request id: the client's
`x-request-id`, or one Serve makes, passed with every handle call the request makes.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import httpx

from tests.support import API_KEY


def serve_logs() -> Path:
    """The serve log folder of the session app's cluster (this process joined it)."""
    import ray

    return Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"


def lines_naming(folder: Path, deployment: str, word: str) -> list[str]:
    return [
        line
        for path in folder.glob(f"replica_serve_app_{deployment}_*.log")
        for line in path.read_text(errors="replace").splitlines()
        if word in line
    ]


def test_every_line_about_a_request_in_each_replica_carries_its_id(
    app_url: str, app_cluster: None
) -> None:
    request_id = f"trace-{uuid.uuid4().hex}"
    answer = httpx.post(
        f"{app_url}/v1/responses",
        headers={"Authorization": f"Bearer {API_KEY}", "x-request-id": request_id},
        json={"model": "gpt-oss-120b", "input": "Say hello.", "max_output_tokens": 64},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers.get("x-request-id") == request_id  # Serve took the client's id
    response_id = answer.json()["id"]
    folder = serve_logs()
    deadline = time.monotonic() + 15
    while True:  # the replicas write their logs as they go; give the last lines a moment
        ingress = lines_naming(folder, "ResponsesIngress", response_id)
        engine = lines_naming(folder, "EngineDeployment", response_id)
        if (ingress and engine) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # The app's own lines about the response, in each replica's Serve log: the turn's in the
    # ingress replica (its prompt, then its outcome), the generation's in the engine replica.
    assert any(re.search(rf"response {response_id}: \d+ prompt tokens", x) for x in ingress)
    assert any(re.search(rf"response {response_id}: (completed|incomplete)", x) for x in ingress)
    assert any(f"request {response_id}: " in line for line in engine), engine
    for line in ingress + engine:
        assert request_id in line, line
