"""Real mailboxes (issue 24): agents reachable by email, replies out through a relay.

A sans-I/O core (addresses, message, auth, outgoing, dsn) and thin I/O at its edges: the
SMTP listener (server), what an accepted message becomes (intake), its attachments in the
vault (attachments), the relay (relay), the replies' way out (outbox), the office's DKIM keys
(keys) and the wiring into the app (gateway). Inbound mail takes the path internal mail
takes (`bot.mail.mailer.Mailer`): a signed header, a state label, threads as comments, the
ledger.
"""
