"""Checkpoint readers: GGUF files, Hugging Face safetensors directories, tokenizers."""
