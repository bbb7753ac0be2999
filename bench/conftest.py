"""pytest-benchmark configuration for bench/ (not part of the test suite)."""
