"""The `suffixd` command line."""
