"""Test doubles of the platform's services, for tests that need one without its servers."""
