"""The index's schema as one versioned history, for both engines.

Store modules register their tables (`register_schema`) and the columns they added after a
table's first release (`register_columns`) under a version. At open, under a lock (SQLite's
write lock, PostgreSQL's advisory lock), every version above the one recorded in
`schema_migrations` is applied in order and recorded. Version 1 is idempotent (CREATE ... IF
NOT EXISTS, missing columns added), so a data directory from before the history began opens as
it is and is recorded at 1.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from bot.store.sql import Engine, ddl

MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version {int} PRIMARY KEY,
    name {text} NOT NULL,
    applied_at {real} NOT NULL
)"""

NAMES = {
    1: "the index as first released: mails, comments, queue, ledger, tokens, console",
    2: "replicas: heartbeats, queue leases, idempotency owners, the shared write budget",
    3: "queue takeovers and claim numbers: deliveries a stopped replica held are counted,"
       " run alone, and dead-lettered once they have stopped replicas too often; a delivery"
       " is finished only under its latest claim",
    4: "offices: every row carries the office (org) it belongs to, and the ledger is one hash"
       " chain per office; rows written before are assigned by their repository",
    5: "reconciliation: the failed deliveries already asked for again, and how far the last"
       " listing of the forge's deliveries reached",
    6: "the queue's pending rows indexed as a claim reads them (in order, by issue, by due"
       " time): a claim costs the same whatever the backlog",
    7: "mail moves in forge order: the forge time of each mail's last state move, so a move"
       " that happened before it (a delivery handled late) is refused; and the words of the"
       " replies the app posted, kept a while for the doctor to post again if the forge lost"
       " them",
    8: "the queue's claimed rows indexed by issue: replicas claim side by side, each looking"
       " whether another runs one of an issue's deliveries",
    9: "email attachments: each accepted message's files, committed to the agent's vault,"
       " with the mail and message they came with, name, type, size, blob sha and link",
    10: "remote MCP with OAuth 2.1: the clients that registered themselves, and the requests,"
        " codes and tokens handed out (hashed), each bound to a person, an office and the MCP"
        " endpoint",
    11: "deliveries parked until their issue is mail, indexed by issue: a delivery about a"
        " vault's issue whose opening is missing waits for its adoption, then runs",
    12: "waiting made visible in the forge: per repository and principal, the \"Waiting on\""
        " tracking issue an outcome is shown blocked by while its questions wait on them",
    13: "rates shared by the replicas: the messages one outside sender sent one agent in the"
        " last minute, counted in the index (email-rate:<office>/<agent>/<sender>)",
    14: "the open questions indexed as the inbox reads them (by id and by asker, each covering"
        " its lists): the inbox's page is cut in the query, visibility a condition of it",
    15: "each open question's office, repository and asker beside who it waits on, and asked"
        " questions indexed by repository: the inbox's pages and counts read from indexes",
    16: "which named locks each replica takes: 64-bit hashes of their names, which no office"
        " can make collide with another's; a replica of the release before (none named) is"
        " excluded its way too while it lives; and the forge writes' creations indexed, so a"
        " write's place reads the last minute and the hour's creations, not the hour",
    17: "OAuth consents keep what the person signed in with (a forge account, or an API"
        " token's hash): a grant ends once that no longer stands for them",
    18: "each queued delivery's office: claims share the worker between offices, so one"
        " office's backlog is not run before everything another queued after it",
    19: "a forge comment is recorded once for its issue, not once across the index: another"
        " org's signed delivery naming the id first no longer hides an office's comment; and"
        " API tokens may expire (a run's, at its timeout and a margin)",
    20: "who each office's config last named, so a config that removes someone revokes their"
        " tokens whichever replica reads it first, however long after the push; and the"
        " account each installation's org belongs to, so a name another account takes over"
        " starts a new office; what an office is shown is numbered per office (its ledger"
        " entries, chats and runs; inbox cursors keyed), not among every office's rows",
    21: "the name each ledger entry was hashed under, once its office was renamed with its"
        " org: the office's chain goes on under the new name and still verifies",
    22: "the prune's look-ups indexed (the times it deletes by, queue rows by delivery): each"
        " batch reads what it deletes, not its whole table",
    23: "a run's API token names the mail that woke the run: mail its agent sends with it"
        " counts one hop more than that mail (the loop guard)",
    24: "each mail run names the mail that woke it, and an agent's runs are indexed by time:"
        " mail an agent sends while such a run is open, with whatever token, counts one hop"
        " more than that mail (the loop guard)",
    25: "the newest timeline event of each issue that an org-signed Gitea delivery was taken"
        " on: an event is taken once, so an org's admins cannot sign another change in the"
        " name of someone who once made one",
    26: "each org's own webhook secret (Gitea) has a generation, moved on by `vaultmail"
        " gitea-hook ORG --rotate` for that org alone: the secret before is accepted for a"
        " grace after, then refused",
    27: "each mail an agent sends names the run it was sent from (what woke that run): each"
        " send from one run to one recipient counts a hop past the last (the loop guard)",
    28: "the comment each org-signed Gitea `created` was taken on: a comment's `created` is"
        " taken once, so an org's admins cannot sign it again as its author's",
    29: "each send from a run claims its place in the run's budget as it is counted (the loop"
        " guard): sends made at once each count the others, and a retried key keeps its place",
    30: "each org's own webhook secret (Gitea) is made for the org's id on the forge, not its"
        " name alone: an org made again under a deleted org's name is not signed for by the"
        " old org's secret; the names known before are recorded with their org's id, whose"
        " secret made from the name stays theirs",
    31: "when each org-signed Gitea delivery's event or comment was taken (indexed): what is"
        " taken is kept for the retention, which is as old as an event a delivery is taken"
        " on may be, then pruned",
    32: "comments follow the forge after they are indexed: when one was edited there (its"
        " words read back) or deleted (a tombstone without its words)",
    33: "each timeline row an org-signed Gitea delivery was taken on, one by one: a delivery"
        " about an earlier act (redelivered, or out of order) takes its own row, not yet"
        " taken, where the newest row taken on the issue refused it",
    34: "each adopted mail keeps the forge time of the adoption's write: an edit the forge"
        " dates no later was written over by it, and is put back in view unsigned",
    35: "a comment's edit that came before the comment was indexed (its `created` late) is"
        " kept until it is, so the comment is indexed in the words the forge shows",
    36: "the orgs a `_vaultmail` record naming the org (the form before ids) may prove an email"
        " domain for: each org the index held at this upgrade, with its account, and only that"
        " account under that name; not an org first known after, nor another made under the"
        " name",
    37: "the item each update on an outcome tells of (a plan, evidence) in a column of its own,"
        " which a rename of its repository or org rewrites: an update is judged by the name"
        " the repository has now",
    38: "named locks' sessions on PostgreSQL have leases, renewed while the server says the"
        " session is alive: a replica taking a lock a dead session let go waits out its lease",
    39: "whoever an office's config no longer names is recorded as departed, with the login"
        " they had, until a config names them again: the questions waiting on them are sent"
        " back from that record, so a sweep cut off part-way is finished by the next read",
    40: "the chats waiting for an answer indexed by office and start: the caps on waiting"
        " chats (one person's across the office's agents, the office's) count only those",
    41: "each office's recorded members note which read of its config recorded them: every"
        " read of the config from the forge is applied (one read when nothing differs), so a"
        " config pushed back to a text a replica still held is recorded, and a read older than"
        " the one recorded is not",
    42: "each run's end is kept: what an agent writes on the forge counts a hop past the mail"
        " of the run open when the forge says it was written, however late it is heard of"
        " (the loop guard)",
    43: "deliveries' issue keys in lower case, the one form stored, compared and locked in"
        " (a forge's names are case-insensitive): the keys queued before are lowered, and so"
        " is each a replica of the release before writes while it lives",
    44: "each idempotency claim has an id of its own, which an office's rename keeps: a try at"
        " work while its office was renamed records its result under the key's new name",
    45: "the operator's office file (VAULTMAIL_OFFICE) is bound to the org account it was"
        " first served to: an org made again under its name by another user is not served it",
    46: "the forge write budget placed without a transaction of its own on PostgreSQL: a"
        " function writes a group of places under the installation's key only if none was"
        " placed since they were found (two round trips where five were)",
    47: "the mails indexed by vault (its name in any case) and number, and the installations"
        " by installation id: the mail of an issue and the orgs of an installation, which"
        " every delivery about an issue asks for, are each a look-up, not a read of the table",
    48: "each rate hit names the message it counted (its sender and Message-ID, hashed): a"
        " message sent again after a 451 is not charged again for the copies counted before",
    49: "the entries of VAULTMAIL_OUTBOUND_ALLOW naming an org by its login are bound to the"
        " org account they were first used for: an org made again under the login by another"
        " account does not reach what was allowed for the one before",
    50: "the rate hits indexed by time: the leader's prune deletes those past a day, which"
        " a key no sender counts again kept for ever",
}


@dataclass
class Migration:
    version: int
    name: str
    sqlite: list[str] = field(default_factory=list)  # scripts, in order
    postgres: list[str] = field(default_factory=list)
    columns: dict[str, dict[str, str]] = field(default_factory=dict)  # table -> name -> decl
    # scripts run after the columns are added (backfills of the new columns, their indexes)
    sqlite_after: list[str] = field(default_factory=list)
    postgres_after: list[str] = field(default_factory=list)


_MIGRATIONS: dict[int, Migration] = {}


def _migration(version: int) -> Migration:
    if version not in NAMES:
        raise ValueError(f"schema version {version} has no name in bot.store.migrations.NAMES")
    return _MIGRATIONS.setdefault(version, Migration(version, NAMES[version]))


def register_schema(sql: str, *, postgres: str | None = None, version: int = 1) -> None:
    """A module's tables and indexes, written once with each column's type a slot each engine
    fills (`bot.store.sql.ddl`); `postgres` says it another way where the engines differ
    (SQLite's triggers, PostgreSQL's functions)."""
    m = _migration(version)
    m.sqlite.append(ddl(sql, "sqlite"))
    m.postgres.append(ddl(sql, "postgresql") if postgres is None else postgres)


def register_columns(table: str, columns: dict[str, str], *, version: int = 1) -> None:
    """Columns added to a table after its first release: added where missing (each
    declaration's type a slot, as in `register_schema`)."""
    _migration(version).columns.setdefault(table, {}).update(columns)


def register_backfill(sqlite: str, *, postgres: str, version: int) -> None:
    """Statements run once the version's columns exist: filling them for older rows."""
    m = _migration(version)
    m.sqlite_after.append(sqlite)
    m.postgres_after.append(postgres)


# every module that registers tables (or indexes: the prune's): each is loaded before the
# migrations are read, so that whatever opens the index first (the app, or a command such as
# `vaultmail token create` on a new data directory) makes all of them, each version whole (a
# later version's columns go on tables an earlier one made)
TABLES = ("api_tokens", "attachments", "budget", "chats", "comments", "db", "deliveries",
          "domain_proofs", "hook_secrets", "installations", "ledger", "mails", "members",
          "moves", "oauth", "offices", "outbound", "prune", "rates", "replies", "sessions",
          "strangers", "waiting")


def migrations() -> list[Migration]:
    for name in TABLES:
        importlib.import_module(f"bot.store.{name}")
    return [_MIGRATIONS[v] for v in sorted(_MIGRATIONS)]


def column(decl: str, engine: Engine) -> str:
    """A column's declaration (as registered) in `engine`'s types."""
    return ddl(decl, engine)
