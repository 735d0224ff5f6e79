"""The office config: its model and where it comes from."""
