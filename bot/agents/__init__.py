"""Small example agents that `dispatch: {command: [...]}` can run (see docs/using.md, Runs)."""
