"""Several nodes through torchrun (issue 26), tested on one machine as two nodes over
localhost: two torchrun agents (`--nnodes 2 --nproc-per-node 1`, node ranks 0 and 1, a static
rendezvous at 127.0.0.1) each start `python -m infergen serve …`. Rank 0 serves HTTP; rank 1
joins the group from torchrun's environment and serves rank 0. The server answers the openai
client with what one process generates, and SIGTERM to node 0 stops both nodes, leaving no
process."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import openai
import psutil

from infergen.engine.sampling_params import SamplingParams
from infergen.engine.workers import free_port

PROMPT = "The capital of France is"


def _node(node: int, master: int, port: int, model) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
           "1", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port",
           str(master), "-m", "infergen", "serve", "--model", str(model), "--port", str(port),
           "--kv-cache-memory", "64MiB", "--served-model-name", "smol"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _tree(proc: subprocess.Popen) -> list[psutil.Process]:
    return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_two_nodes_over_localhost_serve_what_one_process_does(default_model_path,
                                                              reference_llm):  # fmt: skip
    master, port = free_port(), free_port()
    nodes = [_node(n, master, port, default_model_path) for n in (0, 1)]
    url, deadline = f"http://127.0.0.1:{port}", time.time() + 180
    try:
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            for node in nodes:
                assert node.poll() is None, node.stderr.read()
            assert time.time() < deadline, "the two-node server did not come up"
            time.sleep(0.3)
        processes = [p for node in nodes for p in _tree(node)]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        got = client.completions.create(model="smol", prompt=PROMPT, max_tokens=12,
                                        temperature=0)  # fmt: skip
        want = reference_llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12))[0]
        assert got.choices[0].text == want.text
        assert got.usage.completion_tokens == 12
    finally:
        nodes[0].send_signal(signal.SIGTERM)  # the agent passes it on to rank 0, the server
        try:
            codes = [node.wait(timeout=90) for node in nodes]
        finally:
            for node in nodes:
                if node.poll() is None:
                    node.kill()
    assert codes[1] == 0, nodes[1].stderr.read()  # rank 1 was told to stop, and stopped
    assert not _alive(processes)
    assert "rank 1 of 2 (torchrun): serving rank 0" in nodes[1].stderr.read()
