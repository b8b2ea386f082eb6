"""exo plugin download_hf."""
