"""Hook implementations of the engine_mlx plugin."""
