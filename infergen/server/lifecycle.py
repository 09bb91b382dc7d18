"""Bounded shutdown: uvicorn's server, whose first SIGTERM / SIGINT stops admitting requests
(503), gives the ones in flight `shutdown_timeout` seconds to finish, then aborts the rest
(a stream ends with an error event, a whole response is a 503); a second signal exits at
once. uvicorn itself stops listening and waits for the connections to close, no longer than
the timeout and a margin.

An engine that can no longer step (a tensor-parallel worker died: server/async_engine.py's
EngineStopped) stops the server the same way, and `exit_code` says it failed (1)."""

from __future__ import annotations

import sys

import uvicorn

from infergen.server.async_engine import AsyncEngine

MARGIN_S = 5.0  # after the timeout: for the aborted requests' answers to go out


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, shutdown_timeout: float):
        config.timeout_graceful_shutdown = int(shutdown_timeout + MARGIN_S)
        super().__init__(config)
        self.engine, self.shutdown_timeout = engine, shutdown_timeout
        self.exit_code = 0
        engine.on_failure = self._engine_failed

    def _engine_failed(self, error: Exception) -> None:
        """(the engine thread) The engine cannot step any more: stop serving, exit 1."""
        print(f"infergen: the engine stopped, shutting down: {error}", file=sys.stderr,
              flush=True)  # fmt: skip
        self.exit_code = 1
        self.should_exit = True

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit:  # the second signal, SIGTERM or SIGINT: now
            self.force_exit = True
        else:
            self.engine.drain(self.shutdown_timeout)
        super().handle_exit(sig, frame)
