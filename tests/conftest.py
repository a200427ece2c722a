"""Shared by all tests. Tests that start real SGLang workers live in tests/live/ and share its session fixtures;
test doubles live in tests/doubles/ (importable as ``doubles`` through the pytest ``pythonpath`` option)."""
