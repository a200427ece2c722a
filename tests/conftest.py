"""Shared fixtures. Tests that start real SGLang workers live in tests/worker/ and share one worker."""
