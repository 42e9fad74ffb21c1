"""Helpers and child programs for the test_store_*.py tests (not collected by pytest)."""
