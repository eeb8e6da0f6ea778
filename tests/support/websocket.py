"""Reading a Responses WebSocket through the openai SDK's ``client.responses.connect()``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from openai import OpenAI

# The events that end a response's stream.
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


@contextmanager
def connected(client: OpenAI, deadline_s: float = 60) -> Iterator[Any]:
    """``client.responses.connect()``, closed after ``deadline_s``: an event that never comes
    fails the test (the SDK's ``recv`` has no timeout of its own) instead of hanging it."""
    with client.responses.connect() as connection:
        timer = threading.Timer(deadline_s, connection.close)
        timer.start()
        try:
            yield connection
        finally:
            timer.cancel()


def until(connection: Any, done: Callable[[Any], bool]) -> list[Any]:
    """Events until ``done(event)`` (that one included)."""
    events = []
    while True:
        event = connection.recv()
        events.append(event)
        if done(event):
            return events


def until_terminal(connection: Any) -> list[Any]:
    """Events of one response, through its terminal event (or an error event)."""
    return until(connection, lambda event: event.type in TERMINAL or event.type == "error")
