"""The model layer shared by both runners: decoders of the Llama family, a BERT encoder,
attention over paged KV caches, and weight loading (HF safetensors directories, GGUF)."""
