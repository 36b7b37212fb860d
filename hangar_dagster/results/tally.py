"""The start check's tally: one narrow row per trial attempt and each month's spend, kept current
as records are stored, in a database with B-tree indexes and short transactions.

Deciding whether a trial may start (queue/starts.py ``blocker``, the TPM throttle,
``next_attempt``) must not read full trial rows (trace and manifest JSON) nor wait on the
results store's engine: the embedded DuckDB file takes ~10 ms just to open and is held by one
process at a time. So every stored trial attempt also lands here, narrow (its key, when it
finished, its outcome and infra reason, its ledger cost and tokens) and indexed, and each
month's spend per experiment is summed as the attempts arrive, as are each experiment's counted
retries and the trial keys whose highest attempt is an infra error (``tally_open_infra``: the
retry cap reads those, never the infra errors already retried). Every question a start asks is
then an index lookup, or a read of a few rows the queue's own rules keep few, whose cost does
not grow with the attempts stored.

Where it lives: the embedded store keeps it in SQLite (``HANGAR_HOME/tally.sqlite``, WAL: readers
never wait, a writer holds the file for one short transaction; Python's own ``sqlite3``); the
DuckLake store in plain tables of the catalog's Postgres database (every machine sees the same).

Not a second truth: a row is applied once, by its key (``INSERT ... ON CONFLICT DO NOTHING``,
and the spend only when that inserted), from a record already durable in the store; a crash
between the two is healed from the store's own journal (embedded: the ``pending/`` markers;
DuckLake: ``tally_unapplied``, results/lake.py), and a tally that is missing or of another
``VERSION`` is rebuilt from the store's rows. tests/results/test_tally.py checks it against the
full recomputation after crashes. docs/data.md, "The tally".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# Bump when the tables or what a row holds change: a tally of another version is rebuilt.
VERSION = "3"

# queue/retries.py's CAP_EXEMPT, NEVER_RETRIED and BREAKER_NEUTRAL, repeated here so this module
# needs nothing from queue/ (a test checks they agree).
CAP_EXEMPT_REASONS = ("power_down", "control_plane_restart", "interrupted")
NEVER_RETRIED_REASONS = ("drift", "auth", "agent_cli")
BREAKER_NEUTRAL_REASONS = (
    "drift",
    "agent_cli",
    "power_down",
    "control_plane_restart",
    "interrupted",
)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

# Portable between SQLite and Postgres (upserts, partial indexes, row values).
DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS tally_attempts (
  experiment_id TEXT NOT NULL,
  trial_key TEXT NOT NULL,
  attempt BIGINT NOT NULL,
  finished_us BIGINT NOT NULL,
  outcome_class TEXT NOT NULL,
  infra_reason TEXT,
  run_id TEXT NOT NULL,
  cost_usd DOUBLE PRECISION NOT NULL,
  tokens BIGINT NOT NULL,
  month TEXT NOT NULL,
  systemic BIGINT NOT NULL,
  counts_toward_cap BIGINT NOT NULL,
  PRIMARY KEY (experiment_id, trial_key, attempt))""",
    # the breaker's streak: the infra errors it counts (not the neutral ones), by time
    "CREATE INDEX IF NOT EXISTS tally_systemic ON tally_attempts "
    "(experiment_id, finished_us, trial_key, attempt) WHERE systemic = 1",
    # the breaker's last measurement: the newest attempt that is not an infra error
    "CREATE INDEX IF NOT EXISTS tally_measured ON tally_attempts "
    "(experiment_id, finished_us, trial_key, attempt) WHERE outcome_class <> 'infra_error'",
    # the TPM throttle: tokens of attempts finished in the last minute, every experiment
    "CREATE INDEX IF NOT EXISTS tally_finished ON tally_attempts (finished_us)",
    """CREATE TABLE IF NOT EXISTS tally_spend (
  month TEXT NOT NULL,
  experiment_id TEXT NOT NULL,
  attempts BIGINT NOT NULL,
  cost_usd DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (month, experiment_id))""",
    # an experiment's own budget (budget.max_cost_usd): its spend over every month
    "CREATE INDEX IF NOT EXISTS tally_spend_experiment ON tally_spend (experiment_id)",
    """CREATE TABLE IF NOT EXISTS tally_experiments (
  experiment_id TEXT PRIMARY KEY,
  author TEXT NOT NULL)""",
    "CREATE TABLE IF NOT EXISTS tally_meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
    # per experiment: retries started that count toward the cap (kept, not counted per check)
    """CREATE TABLE IF NOT EXISTS tally_retries_counted (
  experiment_id TEXT PRIMARY KEY,
  n BIGINT NOT NULL)""",
    # per trial key whose highest attempt is an infra error: that attempt (kept as attempts
    # arrive, so the retry cap reads the keys still open, never the infra errors retried since)
    """CREATE TABLE IF NOT EXISTS tally_open_infra (
  experiment_id TEXT NOT NULL,
  trial_key TEXT NOT NULL,
  attempt BIGINT NOT NULL,
  finished_us BIGINT NOT NULL,
  infra_reason TEXT,
  run_id TEXT NOT NULL,
  counts_toward_cap BIGINT NOT NULL,
  PRIMARY KEY (experiment_id, trial_key))""",
    "CREATE INDEX IF NOT EXISTS tally_open_counted ON tally_open_infra "
    "(experiment_id, attempt) WHERE counts_toward_cap = 1",
    # the TPM throttle's live part: tokens of model answers to attempts still running, as the
    # model proxy saw them; an attempt's rows go when its own row arrives (it counts them all)
    """CREATE TABLE IF NOT EXISTS tally_live (
  experiment_id TEXT NOT NULL,
  trial_key TEXT NOT NULL,
  attempt BIGINT NOT NULL,
  at_us BIGINT NOT NULL,
  tokens BIGINT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS tally_live_at ON tally_live (at_us)",
    "CREATE INDEX IF NOT EXISTS tally_live_attempt ON tally_live (experiment_id, trial_key, attempt)",
)
TABLES = (
    "tally_attempts",
    "tally_spend",
    "tally_experiments",
    "tally_meta",
    "tally_retries_counted",
    "tally_open_infra",
    "tally_live",
)
# Live rows older than this are dropped as new ones come: an attempt that never finished (its
# run died) left them, and the throttle looks back one minute only.
LIVE_KEEP = dt.timedelta(hours=1)

# The trial columns a tally row is made from (what a rebuild selects from the store).
TRIAL_COLUMNS = (
    "experiment_id",
    "trial_key",
    "attempt",
    "finished_at",
    "outcome_class",
    "infra_reason",
    "run_id",
    "cost_usd",
    "cost_estimate_usd",
    "tokens_in",
    "tokens_out",
    "reused_from",
)
_ROW_COLS = (
    "experiment_id, trial_key, attempt, finished_us, outcome_class, infra_reason, run_id, "
    "cost_usd, tokens, month, systemic, counts_toward_cap"
)
_ATTEMPT_COLS = (
    "experiment_id, trial_key, attempt, finished_us, outcome_class, infra_reason, run_id"
)
_OPEN_COLS = "experiment_id, trial_key, attempt, finished_us, infra_reason, run_id"


@dataclass(frozen=True)
class Attempt:
    """A trial attempt as the queue's rules see it (queue/retries.py): no JSON, no blobs."""

    experiment_id: str
    trial_key: str
    attempt: int
    finished_at: dt.datetime
    outcome_class: str
    infra_reason: str | None
    run_id: str


@dataclass(frozen=True)
class StartState:
    """What the breaker and the retry cap need of one experiment (queue/starts.py ``blocker``).

    Each part is bounded by what the rules let happen before they stop starts, not by the
    attempts stored: the streak trips the breaker at its limit, and the open keys are retried
    (and so leave) until the cap stops starts.
    """

    # the infra errors the breaker counts (not the neutral ones) after the experiment's newest
    # attempt that is not an infra error, in time order: the breaker's streak
    streak: list[Attempt]
    # retries already started that count toward the experiment's cap
    counted_retries: int
    # keys whose highest attempt is an infra error a counted retry would replace, with a retry
    # left (attempt <= per_key): what the cap would have to allow
    open_counted: int


class Cursor(Protocol):
    """The part of a DB-API cursor used here (sqlite3's and psycopg2's)."""

    @property
    def rowcount(self) -> int: ...

    # positional-only by their "__" names
    def execute(self, __sql: str, __params: Sequence[Any] = ...) -> Any: ...

    def executemany(self, __sql: str, __params: Iterable[Sequence[Any]]) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def fetchone(self) -> Any: ...


def micros(at: dt.datetime) -> int:
    """``at`` as whole microseconds since the epoch (exact: datetimes carry microseconds)."""
    return (at - _EPOCH) // dt.timedelta(microseconds=1)


def from_micros(us: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=us)


def trial_row(row: dict[str, Any]) -> tuple[Any, ...]:
    """The tally row of one trial row (a ``schema.Table.to_row`` dict or a store query's).

    The cost is the budget ledger's (``budget_ledger``: an unknown cost counts as its estimate)
    and the month is the UTC month its attempt finished in, as there. A reused trial
    (experiment/reuse.py) costs nothing and used no tokens here: the experiment that measured it
    paid, and its tokens were spent then.
    ``systemic``: an infra error the outage breaker counts; ``counts_toward_cap``: an infra
    error whose retry counts toward the experiment's cap (neither never retried nor
    cap-exempt), as queue/retries.py.
    """
    finished: dt.datetime = row["finished_at"].astimezone(dt.UTC)
    reused = bool(row.get("reused_from"))
    cost = 0.0 if reused else row["cost_usd"]
    if cost is None:
        cost = row.get("cost_estimate_usd")
    infra = row["outcome_class"] == "infra_error"
    reason = row["infra_reason"]
    return (
        row["experiment_id"],
        row["trial_key"],
        int(row["attempt"]),
        micros(finished),
        row["outcome_class"],
        reason,
        row["run_id"],
        float(cost or 0.0),
        0 if reused else int(row["tokens_in"]) + int(row["tokens_out"]),
        f"{finished:%Y-%m}",
        int(infra and reason not in BREAKER_NEUTRAL_REASONS),
        int(infra and reason not in NEVER_RETRIED_REASONS and reason not in CAP_EXEMPT_REASONS),
    )


InsertMany = Callable[[Cursor, str, list[tuple[Any, ...]]], None]


class TallySQL:
    """The tally's statements over a DB-API cursor; ``?`` becomes ``%s`` for psycopg2.

    ``values``: how the backend inserts many rows in one statement (psycopg2's
    ``execute_values``, whose SQL ends in ``VALUES %s``); without it, ``executemany``.
    """

    def __init__(self, paramstyle: str, values: InsertMany | None = None) -> None:
        self._pyformat = paramstyle in ("format", "pyformat")
        self._values = values

    def q(self, sql: str) -> str:
        return sql.replace("?", "%s") if self._pyformat else sql

    def create(self, cur: Cursor) -> None:
        """The tables, after dropping those of another version (their rows are rebuilt)."""
        cur.execute("CREATE TABLE IF NOT EXISTS tally_meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        cur.execute(self.q("SELECT v FROM tally_meta WHERE k = ?"), ["version"])
        got = cur.fetchone()
        if (got is not None and got[0] != VERSION) or self._old_attempts(cur):
            for name in TABLES:
                if name != "tally_meta":
                    cur.execute(f"DROP TABLE IF EXISTS {name}")
            cur.execute("DELETE FROM tally_meta")
        for statement in DDL:
            cur.execute(statement)

    def _old_attempts(self, cur: Cursor) -> bool:
        """Whether tally_attempts is there without this version's columns (never built)."""
        if self._pyformat:
            cur.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'tally_attempts' AND table_schema = current_schema()"
            )
        else:
            cur.execute("SELECT name FROM pragma_table_info('tally_attempts')")
        columns = {r[0] for r in cur.fetchall()}
        return bool(columns) and "counts_toward_cap" not in columns

    def built(self, cur: Cursor) -> bool:
        cur.execute(self.q("SELECT v FROM tally_meta WHERE k = ?"), ["version"])
        got = cur.fetchone()
        return bool(got) and got[0] == VERSION

    # ---- writing (inside the caller's transaction) --------------------------------------------

    def apply_trials(self, cur: Cursor, rows: Iterable[tuple[Any, ...]]) -> int:
        """Add trial attempts (``trial_row`` tuples); each counts once however often it comes."""
        added = 0
        for r in rows:
            cur.execute(
                self.q(
                    f"INSERT INTO tally_attempts ({_ROW_COLS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
                ),
                r,
            )
            inserted = cur.rowcount == 1
            # its live tokens are in its own row now (also when it was counted before)
            cur.execute(
                self.q(
                    "DELETE FROM tally_live WHERE experiment_id = ? AND trial_key = ? "
                    "AND attempt = ?"
                ),
                [r[0], r[1], r[2]],
            )
            if not inserted:
                continue  # already counted
            added += 1
            self._count_retry(cur, r)
            self._open(cur, r)
            cur.execute(
                self.q(
                    "INSERT INTO tally_spend (month, experiment_id, attempts, cost_usd) "
                    "VALUES (?, ?, 1, ?) ON CONFLICT (month, experiment_id) DO UPDATE SET "
                    "attempts = tally_spend.attempts + 1, "
                    "cost_usd = tally_spend.cost_usd + excluded.cost_usd"
                ),
                [r[9], r[0], r[7]],
            )
        return added

    def _exempt(self, cur: Cursor, experiment_id: str, key: str, attempt: int) -> bool | None:
        """Whether that attempt is a cap-exempt infra error; None when it is not stored."""
        cur.execute(
            self.q(
                "SELECT outcome_class, infra_reason FROM tally_attempts "
                "WHERE experiment_id = ? AND trial_key = ? AND attempt = ?"
            ),
            [experiment_id, key, attempt],
        )
        got = cur.fetchone()
        if got is None:
            return None
        return bool(got[0] == "infra_error" and got[1] in CAP_EXEMPT_REASONS)

    def _count_retry(self, cur: Cursor, r: tuple[Any, ...]) -> None:
        """queue/retries.py's count, kept: attempt n > 1 counts unless n - 1 is cap-exempt."""
        eid, key, n = r[0], r[1], r[2]
        delta = 1 if n > 1 and not self._exempt(cur, eid, key, n - 1) else 0
        if (
            r[4] == "infra_error"
            and r[5] in CAP_EXEMPT_REASONS
            and self._exempt(cur, eid, key, n + 1) is not None
        ):
            delta -= 1  # its successor, stored first, was counted as replacing nothing exempt
        if delta:
            cur.execute(
                self.q(
                    "INSERT INTO tally_retries_counted (experiment_id, n) VALUES (?, ?) "
                    "ON CONFLICT (experiment_id) DO UPDATE SET "
                    "n = tally_retries_counted.n + excluded.n"
                ),
                [eid, delta],
            )

    def _open(self, cur: Cursor, r: tuple[Any, ...]) -> None:
        """Keep tally_open_infra: a key's row is its highest attempt, while an infra error."""
        cur.execute(
            self.q(
                "SELECT max(attempt) FROM tally_attempts WHERE experiment_id = ? AND trial_key = ?"
            ),
            [r[0], r[1]],
        )
        if int(cur.fetchone()[0]) != r[2]:
            return  # a higher attempt is stored (this one arrived late): it decides
        cur.execute(
            self.q("DELETE FROM tally_open_infra WHERE experiment_id = ? AND trial_key = ?"),
            [r[0], r[1]],
        )
        if r[4] == "infra_error":
            cur.execute(
                self.q(
                    f"INSERT INTO tally_open_infra ({_OPEN_COLS}, counts_toward_cap) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)"
                ),
                [r[0], r[1], r[2], r[3], r[5], r[6], r[11]],
            )

    def apply_experiments(self, cur: Cursor, authors: Iterable[tuple[str, str]]) -> None:
        """Remember experiments' authors (immutable): the spend is summed per author from them."""
        for experiment_id, author in authors:
            cur.execute(
                self.q(
                    "INSERT INTO tally_experiments (experiment_id, author) VALUES (?, ?) "
                    "ON CONFLICT DO NOTHING"
                ),
                [experiment_id, author],
            )

    def rebuild(
        self,
        cur: Cursor,
        trials: Iterable[tuple[Any, ...]],
        authors: Iterable[tuple[str, str]],
    ) -> None:
        """Fill the tally from every stored trial and experiment (a new or outdated tally).

        The attempts go in as a batch (rows a writer applied meanwhile stay: keys count once);
        the sums, the retry counts and the open keys are then computed afresh from them in SQL,
        so they match the attempts whatever the order.
        """
        rows = list(trials)
        for lo in range(0, len(rows), 10_000):
            self._insert_many(cur, rows[lo : lo + 10_000])
        self.apply_experiments(cur, authors)
        cur.execute("DELETE FROM tally_spend")
        cur.execute(
            "INSERT INTO tally_spend (month, experiment_id, attempts, cost_usd) "
            "SELECT month, experiment_id, count(*), sum(cost_usd) FROM tally_attempts "
            "GROUP BY month, experiment_id"
        )
        exempt = ", ".join(f"'{r}'" for r in CAP_EXEMPT_REASONS)
        cur.execute("DELETE FROM tally_retries_counted")
        cur.execute(
            "INSERT INTO tally_retries_counted (experiment_id, n) "
            "SELECT n.experiment_id, count(*) FROM tally_attempts n WHERE n.attempt > 1 "
            "AND NOT EXISTS (SELECT 1 FROM tally_attempts p WHERE p.experiment_id = "
            "n.experiment_id AND p.trial_key = n.trial_key AND p.attempt = n.attempt - 1 "
            f"AND p.outcome_class = 'infra_error' AND p.infra_reason IN ({exempt})) "
            "GROUP BY n.experiment_id"
        )
        cur.execute("DELETE FROM tally_open_infra")
        cur.execute(
            f"INSERT INTO tally_open_infra ({_OPEN_COLS}, counts_toward_cap) "
            f"SELECT {_OPEN_COLS}, counts_toward_cap FROM tally_attempts a "
            "WHERE a.outcome_class = 'infra_error' AND NOT EXISTS (SELECT 1 FROM tally_attempts n "
            "WHERE n.experiment_id = a.experiment_id AND n.trial_key = a.trial_key "
            "AND n.attempt > a.attempt)"
        )
        cur.execute("DELETE FROM tally_meta WHERE k = 'version'")
        cur.execute(self.q("INSERT INTO tally_meta (k, v) VALUES ('version', ?)"), [VERSION])

    def _insert_many(self, cur: Cursor, rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        if self._values is not None:
            self._values(
                cur,
                f"INSERT INTO tally_attempts ({_ROW_COLS}) VALUES %s ON CONFLICT DO NOTHING",
                rows,
            )
            return
        cur.executemany(
            self.q(
                f"INSERT INTO tally_attempts ({_ROW_COLS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
            ),
            rows,
        )

    # ---- reading --------------------------------------------------------------------------

    @staticmethod
    def _attempts(rows: list[Any]) -> list[Attempt]:
        return [
            Attempt(e, k, int(n), from_micros(int(us)), o, r, run)
            for e, k, n, us, o, r, run in rows
        ]

    def start_state(self, cur: Cursor, experiment_id: str, per_key: int) -> StartState:
        """Index lookups only, in two statements (a round trip each in Postgres): the kept
        retry count, a count of the open keys (``per_key``: HANGAR_TRIAL_INFRA_RETRIES) and the
        newest measurement; then the systemic infra errors after it."""
        cur.execute(
            self.q(
                "SELECT (SELECT n FROM tally_retries_counted WHERE experiment_id = ?), "
                "(SELECT count(*) FROM tally_open_infra WHERE experiment_id = ? "
                "AND counts_toward_cap = 1 AND attempt <= ?), "
                "m.finished_us, m.trial_key, m.attempt "
                "FROM (SELECT 1 AS one) AS one LEFT JOIN ("
                "SELECT finished_us, trial_key, attempt FROM tally_attempts "
                "WHERE experiment_id = ? AND outcome_class <> 'infra_error' "
                "ORDER BY finished_us DESC, trial_key DESC, attempt DESC LIMIT 1) AS m ON 1 = 1"
            ),
            [experiment_id, experiment_id, per_key, experiment_id],
        )
        counted, open_counted, last_us, last_key, last_attempt = cur.fetchone()
        after, params = "", [experiment_id]
        if last_us is not None:
            after = "AND finished_us >= ? AND (finished_us, trial_key, attempt) > (?, ?, ?) "
            params += [last_us, last_us, last_key, last_attempt]
        cur.execute(
            self.q(
                f"SELECT {_ATTEMPT_COLS} FROM tally_attempts "
                f"WHERE experiment_id = ? AND systemic = 1 {after}"
                "ORDER BY finished_us, trial_key, attempt"
            ),
            params,
        )
        return StartState(self._attempts(cur.fetchall()), int(counted or 0), int(open_counted))

    def open_infra(self, cur: Cursor, experiment_id: str, per_key: int) -> list[Attempt]:
        """The open keys ``start_state`` counts: their infra errors, oldest first."""
        cur.execute(
            self.q(
                f"SELECT {_OPEN_COLS} FROM tally_open_infra "
                "WHERE experiment_id = ? AND counts_toward_cap = 1 AND attempt <= ? "
                "ORDER BY finished_us, trial_key"
            ),
            [experiment_id, per_key],
        )
        return [
            Attempt(e, k, int(n), from_micros(int(us)), "infra_error", r, run)
            for e, k, n, us, r, run in cur.fetchall()
        ]

    def attempts(self, cur: Cursor, experiment_id: str) -> list[Attempt]:
        """Every attempt of the experiment, narrow (a run's plan; not the start check)."""
        cur.execute(
            self.q(
                f"SELECT {_ATTEMPT_COLS} FROM tally_attempts WHERE experiment_id = ? "
                "ORDER BY trial_key, attempt"
            ),
            [experiment_id],
        )
        return self._attempts(cur.fetchall())

    def next_attempt(self, cur: Cursor, experiment_id: str, trial_key: str) -> int:
        cur.execute(
            self.q(
                "SELECT max(attempt) FROM tally_attempts WHERE experiment_id = ? AND trial_key = ?"
            ),
            [experiment_id, trial_key],
        )
        got = cur.fetchone()
        return int(got[0] or 0) + 1

    def tokens_since(self, cur: Cursor, since: dt.datetime) -> int:
        """Tokens of the attempts finished after ``since`` and of the model answers after it to
        attempts still running (their live usage), every experiment."""
        cur.execute(
            self.q(
                "SELECT (SELECT coalesce(sum(tokens), 0) FROM tally_attempts WHERE finished_us > ?)"
                " + (SELECT coalesce(sum(tokens), 0) FROM tally_live WHERE at_us > ?)"
            ),
            [micros(since), micros(since)],
        )
        return int(cur.fetchone()[0])

    def live_add(
        self,
        cur: Cursor,
        experiment_id: str,
        trial_key: str,
        attempt: int,
        tokens: int,
        at: dt.datetime,
    ) -> None:
        """One model answer's tokens to a running attempt (the model proxy's count)."""
        cur.execute(self.q("DELETE FROM tally_live WHERE at_us < ?"), [micros(at - LIVE_KEEP)])
        cur.execute(
            self.q(
                "SELECT 1 FROM tally_attempts WHERE experiment_id = ? AND trial_key = ? AND attempt = ?"
            ),
            [experiment_id, trial_key, attempt],
        )
        if cur.fetchone() is not None:
            return  # finished and counted whole already (an answer logged after its end)
        cur.execute(
            self.q(
                "INSERT INTO tally_live (experiment_id, trial_key, attempt, at_us, tokens) "
                "VALUES (?, ?, ?, ?, ?)"
            ),
            [experiment_id, trial_key, attempt, micros(at), tokens],
        )

    def experiment_spend(self, cur: Cursor, experiment_id: str) -> float:
        """What the experiment's attempts cost, every month together (reused ones cost 0)."""
        cur.execute(
            self.q("SELECT coalesce(sum(cost_usd), 0) FROM tally_spend WHERE experiment_id = ?"),
            [experiment_id],
        )
        return float(cur.fetchone()[0])

    def spend(self, cur: Cursor, month: str) -> list[tuple[str, float, str | None]]:
        """(experiment, spent in ``month``, its author or None if not known here) per experiment."""
        cur.execute(
            self.q(
                "SELECT s.experiment_id, s.cost_usd, e.author FROM tally_spend s "
                "LEFT JOIN tally_experiments e ON e.experiment_id = s.experiment_id "
                "WHERE s.month = ?"
            ),
            [month],
        )
        return [(str(e), float(c), a) for e, c, a in cur.fetchall()]
