"""Models: one generic decoder (transformer.py) configured by architecture rows (arch.py)."""
