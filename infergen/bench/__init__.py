"""Serving benchmarks: workloads, an async OpenAI-API client that measures latencies, reports."""
