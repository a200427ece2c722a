"""Test doubles shared by the test packages (importable as ``doubles.*``: pytest puts tests/ on the path)."""
