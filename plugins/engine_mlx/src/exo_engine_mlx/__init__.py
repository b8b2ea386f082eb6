"""exo plugin engine_mlx."""
