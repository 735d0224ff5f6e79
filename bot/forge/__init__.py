"""The forge client: the Forge interface (`base`), its GitHub implementation (`github`), App
auth (`tokens`), errors (`errors`). Import each from its module: a command that needs only the
errors does not load the client (the CLI's start-up time)."""
