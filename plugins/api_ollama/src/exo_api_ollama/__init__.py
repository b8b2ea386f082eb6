"""exo plugin api_ollama."""
