"""What runs the engine: the app's worker thread, the CLI, the OpenAI-compatible server."""
