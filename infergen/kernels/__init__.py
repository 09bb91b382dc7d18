"""Native kernels: C sources compiled on first use (cached), loaded with ctypes."""
