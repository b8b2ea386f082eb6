"""Hook implementations of the api_ollama plugin."""
