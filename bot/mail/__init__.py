"""Mail: sending, the signed header, slash commands, reindex."""
