"""`brisk serve`: an OpenAI-compatible HTTP API on the same engine as the app.

requests.py parses and validates request bodies, scheduler.py runs them one at a time on
the engine thread, stops.py applies stop sequences, app.py is the Starlette application."""
