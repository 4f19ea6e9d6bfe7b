"""Python client for the suffixd daemon."""
