"""What the app, the CLI and the server hold: the session, its settings, events, errors, metrics."""
