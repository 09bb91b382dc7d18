"""Ops: one op per file, each with a plain-torch `reference()` (the oracle) and the
implementation the layers call. Layers call ops, never raw kernels."""
