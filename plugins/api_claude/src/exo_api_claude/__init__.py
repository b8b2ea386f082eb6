"""exo plugin api_claude."""
