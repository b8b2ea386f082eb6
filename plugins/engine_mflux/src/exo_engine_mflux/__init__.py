"""exo plugin: image generation with mflux."""
