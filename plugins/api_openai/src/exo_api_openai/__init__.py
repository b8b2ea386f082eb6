"""exo plugin api_openai."""
