"""Speculative decoding (issue 24): proposers that draft tokens a decode step verifies."""
