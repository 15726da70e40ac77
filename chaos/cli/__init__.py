"""The `torchchaos` command line."""
