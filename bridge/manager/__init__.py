"""The manager: the daemon, leader election, the HTTP API, metrics, the CLI."""
