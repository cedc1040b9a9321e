"""The REST API: the only door users and the CLI/SDK have into the platform.

It authenticates callers (API keys), scopes every request to the caller's
team, validates input and translates between HTTP and the Trainer's gRPC
contract; it owns no job state itself.
"""
