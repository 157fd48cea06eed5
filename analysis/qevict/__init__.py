"""Chapter 4: a GGUF Llama (SmolLM2-135M-Instruct) in numpy with a pluggable, windowed KV cache;
standard-library corpora; eviction / quantization / three-tier policies; drift metrics."""
