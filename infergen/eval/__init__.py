"""Evaluation on a built engine: quality against a reference (perplexity, KL, top-1), passkey
retrieval, the quantization matrix and the formats report."""
