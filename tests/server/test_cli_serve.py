"""`infergen serve` as a user runs it: a real process, the openai client, SIGTERM to stop (with
a stream in flight, which must still end properly); with two tensor-parallel ranks, SIGTERM
stops both, and a killed worker turns into 503s and a non-zero exit."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import psutil


def test_infergen_serve_answers_the_openai_client_and_stops_on_sigterm(default_model_path):
    proc, url = _serve(default_model_path, "--served-model-name", "smol")
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
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
        code = _stop(proc, signal.SIGTERM, timeout=60)
    reader.join(timeout=10)
    # graceful: the in-flight stream ran to its end (every token, a finish reason), no error
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 48
    # uvicorn shuts down gracefully, then re-raises the signal: exit status 0 or -SIGTERM
    stderr = proc.stderr.read()
    assert code in (0, -signal.SIGTERM), stderr
    assert "server stopped" in stderr and "Traceback" not in stderr


def _serve(model, *extra: str) -> tuple[subprocess.Popen, str]:
    """`infergen serve` in a process of its own, up and healthy: (process, base URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "infergen.cli", "serve", "--model", str(model), "--port",
           str(port), "--kv-cache-memory", "64MiB", *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url, deadline = f"http://127.0.0.1:{port}", time.time() + 120
    while True:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, "server did not come up"
        time.sleep(0.2)


def _stop(proc: subprocess.Popen, sig: int, timeout: float) -> int:
    """Send `sig`; the exit status (the process is killed, and the test fails, after
    `timeout` seconds)."""
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


LONG = {"prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0, "ignore_eos": True}
# two LONG requests do not fit in the KV cache at once: the server would shed the second by its
# queue-time estimate; these tests are about what runs at a shutdown, so nothing is shed
ADMIT_ALL = ("--max-queue-time", "0")


def _long_stream(url: str, lines: list[str], started: threading.Event) -> None:
    """Stream a long completion into `lines`; a connection the server drops ends it (the
    second signal exits without answering)."""
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True},
                          timeout=120) as resp:  # fmt: skip
            for line in resp.iter_lines():
                lines.append(line)
                started.set()
    except httpx.TransportError as exc:
        lines.append(f"dropped: {exc!r}")


def test_sigterm_aborts_what_outlives_the_shutdown_timeout(default_model_path):
    """SIGTERM with a stream and a whole response that would take ~20 s more: the server
    refuses nothing in flight for --shutdown-timeout (2 s), then ends the stream with an
    error event and [DONE] and answers the whole response 503, and exits."""
    proc, url = _serve(default_model_path, "--shutdown-timeout", "2", *ADMIT_ALL)
    lines, started, statuses = [], threading.Event(), []
    try:
        stream = threading.Thread(target=_long_stream, args=(url, lines, started))
        stream.start()
        whole = threading.Thread(
            target=lambda: statuses.append(
                httpx.post(f"{url}/v1/completions", json=LONG, timeout=120).status_code
            )
        )
        whole.start()
        assert started.wait(timeout=60), "no streamed chunk"
        time.sleep(0.5)
    finally:
        signalled = time.time()
        code = _stop(proc, signal.SIGTERM, timeout=30)
    took = time.time() - signalled
    stream.join(timeout=10)
    whole.join(timeout=10)
    assert 2.0 <= took < 2.0 + 5.0 + 3.0  # the timeout, the margin, process exit
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and "shut down" in data[-2] and '"error"' in data[-2]
    assert len(data) > 3  # tokens flowed before the shutdown
    assert statuses == [503]
    assert code in (0, -signal.SIGTERM), proc.stderr.read()


def test_a_second_signal_exits_at_once(default_model_path):
    proc, url = _serve(default_model_path, "--shutdown-timeout", "60", *ADMIT_ALL)
    lines, started = [], threading.Event()
    threading.Thread(target=_long_stream, args=(url, lines, started), daemon=True).start()
    try:
        assert started.wait(timeout=60), "no streamed chunk"
    finally:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        signalled = time.time()
        _stop(proc, signal.SIGTERM, timeout=30)
    assert time.time() - signalled < 10  # not the 60 s the first signal granted


def _workers(proc: subprocess.Popen) -> list[psutil.Process]:
    """The server's tensor-parallel worker processes."""
    children = psutil.Process(proc.pid).children(recursive=True)
    return [p for p in children if "infergen.engine.workers" in " ".join(p.cmdline())]


def test_two_ranks_stop_on_sigterm_and_leave_no_process(default_model_path):
    proc, url = _serve(default_model_path, "-tp", "2")
    try:
        workers = _workers(proc)
        assert len(workers) == 1
        reply = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 3},
                           timeout=60)  # fmt: skip
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
    finally:
        code = _stop(proc, signal.SIGTERM, timeout=60)
    assert code in (0, -signal.SIGTERM), proc.stderr.read()
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)


def test_a_dead_worker_gets_503s_and_the_server_exits_non_zero(default_model_path):
    """A worker killed: the request that needs a step fails with 503 naming the rank, /health
    answers 503 (or the server is already gone), and the server exits 1 on its own, leaving
    no process."""
    proc, url = _serve(default_model_path, "-tp", "2")
    try:
        (worker,) = _workers(proc)
        worker.kill()  # (a zombie until the server reaps it: not waited for here)
        reply = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 3},
                           timeout=60)  # fmt: skip
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert error["type"] == "engine_unavailable" and "rank 1" in error["message"]
        try:
            assert httpx.get(f"{url}/health", timeout=10).status_code == 503
        except httpx.TransportError:
            pass  # (already stopped listening)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 1, proc.stderr.read()
    assert "the engine stopped" in proc.stderr.read()
