"""Small helpers shared by the engine, its labs and its teaching code (upstream: ``vllm/utils``)."""
