"""Hook implementations of the api_openai plugin."""
