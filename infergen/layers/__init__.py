"""Layers: parameter-holding building blocks of the decoder; they call ops/, never kernels."""
