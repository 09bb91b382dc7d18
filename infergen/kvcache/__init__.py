"""KV cache: paged block tensors, the block pool with prefix caching."""
