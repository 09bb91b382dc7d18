"""A live infergen server (uvicorn in a background thread on 127.0.0.1, a free port) over the
default model, and a second engine on the same weights as the oracle."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
import uvicorn

from infergen import LLM
from infergen.server.api import create_app

API_KEY = "test-key"
MODEL = "tiny"


class LiveServer:
    def __init__(self, llm: LLM, **kwargs):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.app = create_app(llm, MODEL, **{"api_key": API_KEY, **kwargs})
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextlib.contextmanager
def own_server(model_path, max_num_seqs: int = 4, **kwargs):
    """A server of its own (create_app's `kwargs`) over a fresh engine with a 32 MiB KV cache
    and `max_num_seqs` seats: (server, llm)."""
    llm = LLM(model_path, kv_cache_memory="32MiB", max_num_seqs=max_num_seqs)
    server = LiveServer(llm, **kwargs)
    try:
        yield server, llm
    finally:
        server.stop()


def wait_for(condition, timeout: float = 30.0) -> bool:
    """Poll `condition` every 50 ms until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="session")
def served_llm(default_model_path):
    """The engine behind the server (only the server's engine thread may step it)."""
    return LLM(default_model_path, kv_cache_memory="64MiB", max_num_seqs=32)


@pytest.fixture(scope="session")
def reference_llm(default_model_path):
    """A second engine on the same weights: the oracle the tests compare responses with."""
    return LLM(default_model_path, kv_cache_memory="64MiB", max_num_seqs=32)


@pytest.fixture(scope="session")
def live(served_llm):
    server = LiveServer(served_llm)
    yield server
    server.stop()


def scrape_metrics(url: str) -> dict[str, float]:
    """GET /metrics as {sample name with labels: value}."""
    import re

    import httpx

    values = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        match = re.match(r"^(\w+(?:\{[^}]*\})?) (\S+)$", line)
        if match:
            values[match.group(1)] = float(match.group(2))
    return values
