"""In-memory stand-ins for the platform's moving parts, for fast unit tests."""
