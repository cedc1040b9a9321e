"""HTTP routes, kept thin: each validates its input and calls one domain function."""
