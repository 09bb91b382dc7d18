"""`infergen serve` as a user runs it: a real process, the openai client, SIGTERM to stop."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import openai


def test_infergen_serve_answers_the_openai_client_and_stops_on_sigterm(default_model_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "infergen.cli",
        "serve",
        "--model",
        str(default_model_path),
        "--port",
        str(port),
        "--kv-cache-memory",
        "64MiB",
        "--served-model-name",
        "smol",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read()
            assert time.time() < deadline, "server did not come up"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["smol"]
        reply = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert reply.choices[0].message.content
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    # uvicorn shuts down gracefully, then re-raises the signal: exit status 0 or -SIGTERM
    stderr = proc.stderr.read()
    assert code in (0, -signal.SIGTERM), stderr
    assert "server stopped" in stderr and "Traceback" not in stderr
