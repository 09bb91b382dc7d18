"""OpenAI-compatible HTTP server: `infergen serve` (FastAPI + uvicorn) over one engine loop."""
