"""The gateway: REST API, queue source, submitter and monitor around one store."""
