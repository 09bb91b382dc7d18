"""`infergen serve` as a user runs it: a real process, the openai client, SIGTERM to stop (with
a stream in flight, which must still end properly)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
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
        # SIGTERM while a stream is in flight: the stream still ends properly
        first_chunk, chunks = threading.Event(), []

        def stream() -> None:
            for chunk in client.completions.create(
                model="smol",
                prompt="Once upon a time",
                max_tokens=48,
                stream=True,
                temperature=0,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            ):
                chunks.append(chunk)
                first_chunk.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first_chunk.wait(timeout=60), "no streamed chunk"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    reader.join(timeout=10)
    # graceful: the in-flight stream ran to its end (every token, a finish reason), no error
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 48
    # uvicorn shuts down gracefully, then re-raises the signal: exit status 0 or -SIGTERM
    stderr = proc.stderr.read()
    assert code in (0, -signal.SIGTERM), stderr
    assert "server stopped" in stderr and "Traceback" not in stderr
