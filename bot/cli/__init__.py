"""The `vaultmail` command line."""
