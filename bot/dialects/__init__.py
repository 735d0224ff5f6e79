"""Adapters that turn another forge's webhooks into the GitHub-shaped events handlers read."""
