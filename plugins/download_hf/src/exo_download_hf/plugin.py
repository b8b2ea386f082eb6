"""Hook implementations of the download_hf plugin."""
