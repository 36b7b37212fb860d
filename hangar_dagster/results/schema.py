"""Tables, columns and views of the store, derived from the pydantic rows in ``records``.

The models are the one definition of every column: this module maps each field's
annotation to a DuckDB type and a Parquet (Arrow) type, names each table's
primary key and Parquet file, and holds the two SQL views analysts share with
the Python reads. docs/data.md documents the result.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import types
import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

import pyarrow as pa

from hangar_dagster.results.records import (
    BaseCheckRecord,
    ExperimentPinRecord,
    ExperimentRecord,
    GradeRecord,
    GradeTestRecord,
    NoteRecord,
    OutcomeClass,
    PinSetRecord,
    Record,
    TrialRecord,
)

_ARROW: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "JSON": pa.string(),  # JSON text; DuckDB's JSON type is VARCHAR underneath
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
}


@dataclass(frozen=True)
class Column:
    name: str
    sql_type: str  # a key of _ARROW
    nullable: bool

    @property
    def arrow_type(self) -> pa.DataType:
        return _ARROW[self.sql_type]


def _sql_type(owner: str, annotation: Any) -> tuple[str, bool]:
    """(DuckDB type, nullable) for one model field's annotation."""
    nullable = False
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"{owner}: only `X | None` unions can be stored, got {annotation!r}")
        nullable, annotation, origin = True, args[0], get_origin(args[0])
    if origin is Literal:
        if not all(isinstance(a, str) for a in get_args(annotation)):
            raise TypeError(f"{owner}: only string Literals can be stored, got {annotation!r}")
        return "VARCHAR", nullable
    if origin in (dict, list) or annotation in (dict, list):
        return "JSON", nullable
    # bool before int: bool is a subclass of int
    for py, sql in ((bool, "BOOLEAN"), (int, "BIGINT"), (float, "DOUBLE"), (str, "VARCHAR")):
        if annotation is py:
            return sql, nullable
    if annotation is dt.datetime:
        return "TIMESTAMPTZ", nullable
    raise TypeError(f"{owner}: no column type for {annotation!r}; extend store_schema._sql_type")


def _safe(part: str) -> str:
    """A file-name component: letters, digits, _ and - kept, every other byte %XX-escaped.

    Ids in specs already match that alphabet, so names stay readable, and since "."
    is always escaped, joining parts with "." can't make two keys share a file.
    """
    keep = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
    return "".join(c if c in keep else "".join(f"%{b:02X}" for b in c.encode()) for c in part)


@dataclass(frozen=True)
class Table:
    name: str
    model: type[Record]
    key: tuple[str, ...]
    # refuse: a second write of a key is an error; same_content: allowed only if the
    # content (minus `volatile`) is identical; append: the store generates the key
    on_duplicate: Literal["refuse", "same_content", "append"]
    file_parts: Callable[[dict[str, Any]], list[str]]
    volatile: tuple[str, ...] = ()
    by_experiment: bool = True
    generated: tuple[Column, ...] = ()  # store-made columns that are not model fields
    # The columns one Parquet file is per, when a file holds many rows (grade_tests: one file
    # per grade); empty: one row per file.
    file_key: tuple[str, ...] = ()

    @property
    def columns(self) -> list[Column]:
        cols = list(self.generated)
        for name, field in self.model.model_fields.items():
            sql, nullable = _sql_type(f"{self.model.__name__}.{name}", field.annotation)
            cols.append(Column(name, sql, nullable))
        return cols

    @property
    def json_columns(self) -> frozenset[str]:
        return frozenset(c.name for c in self.columns if c.sql_type == "JSON")

    def ddl(self) -> str:
        # quoted: some field names (notes.at) are SQL keywords
        cols = ",\n  ".join(
            f'"{c.name}" {c.sql_type}{"" if c.nullable else " NOT NULL"}' for c in self.columns
        )
        return (
            f"CREATE TABLE IF NOT EXISTS {self.name} (\n  {cols},\n"
            f"  PRIMARY KEY ({', '.join(self.key)})\n)"
        )

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow_type, c.nullable) for c in self.columns])

    def to_row(self, record: Record) -> dict[str, Any]:
        """The record as one Parquet/DuckDB row: JSON fields as text, datetimes checked aware."""
        row = record.model_dump()
        for c in self.columns:
            value = row.get(c.name)
            if c.sql_type == "JSON" and value is not None:
                row[c.name] = json.dumps(value, sort_keys=True, ensure_ascii=False)
            elif c.sql_type == "TIMESTAMPTZ" and value is not None and value.tzinfo is None:
                raise ValueError(
                    f"{self.model.__name__}.{c.name} is a naive datetime; "
                    "give it a timezone (e.g. records.utcnow())"
                )
        if self.on_duplicate == "append":
            row[self.key[0]] = _generated_id(row)
        return row

    def from_row(self, row: dict[str, Any]) -> Record:
        fields = {k: v for k, v in row.items() if k in self.model.model_fields}
        for name in self.json_columns & fields.keys():
            if isinstance(fields[name], str):
                fields[name] = json.loads(fields[name])
        for c in self.columns:
            value = fields.get(c.name)
            if isinstance(value, dt.datetime):
                fields[c.name] = value.astimezone(dt.UTC)  # DuckDB answers in its session zone
        return self.model.model_validate(fields)

    def relpath(self, row: dict[str, Any]) -> str:
        """Where a row's Parquet file lives, relative to the parquet/ directory."""
        stem = ".".join(_safe(str(p)) for p in self.file_parts(row))
        if self.by_experiment:
            return f"{self.name}/experiment_id={_safe(row['experiment_id'])}/{stem}.parquet"
        return f"{self.name}/{stem}.parquet"

    def glob(self) -> str:
        return f"{self.name}/*/*.parquet" if self.by_experiment else f"{self.name}/*.parquet"


def _generated_id(row: dict[str, Any]) -> str:
    """A note's id: its time first so file names sort by time, then randomness."""
    at: dt.datetime = row["at"]
    return f"{at.astimezone(dt.UTC):%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:12]}"


def trial_parts(key: str, attempt: int) -> list[str]:
    """File-name parts of one trial (or grade) attempt: variant, task, replicate, attempt-N."""
    return [*key.split("/"), f"attempt-{attempt}"]


TABLES: tuple[Table, ...] = (
    Table("experiments", ExperimentRecord, ("experiment_id",), "refuse", lambda r: ["experiment"]),
    Table(
        "pin_sets",
        PinSetRecord,
        ("pin_set",),
        "same_content",
        lambda r: [r["pin_set"]],
        volatile=("created_at",),
        by_experiment=False,
    ),
    Table(
        "experiment_pins",
        ExperimentPinRecord,
        ("experiment_id", "variant"),
        "same_content",
        lambda r: [r["variant"]],
        volatile=("run_id",),
    ),
    Table(
        "base_checks",
        BaseCheckRecord,
        ("experiment_id", "task"),
        "same_content",
        lambda r: [r["task"]],
        volatile=("checked_at", "run_id"),
    ),
    Table(
        "trials",
        TrialRecord,
        ("experiment_id", "trial_key", "attempt"),
        "refuse",
        lambda r: trial_parts(r["trial_key"], r["attempt"]),
    ),
    Table(
        "grades",
        GradeRecord,
        ("experiment_id", "trial_key", "attempt"),
        "refuse",
        lambda r: trial_parts(r["trial_key"], r["attempt"]),
    ),
    Table(
        "grade_tests",
        GradeTestRecord,
        ("experiment_id", "trial_key", "attempt", "test_id"),
        "refuse",
        lambda r: trial_parts(r["trial_key"], r["attempt"]),
        file_key=("experiment_id", "trial_key", "attempt"),
    ),
    Table(
        "notes",
        NoteRecord,
        ("note_id",),
        "append",
        lambda r: [r["note_id"]],
        generated=(Column("note_id", "VARCHAR", False),),
    ),
)

BY_MODEL: dict[type[Record], Table] = {t.model: t for t in TABLES}
BY_NAME: dict[str, Table] = {t.name: t for t in TABLES}

_OUTCOMES: tuple[str, ...] = get_args(OutcomeClass)
_HIDDEN = ("total", "passed", "failed", "errors", "skipped")

# The one place the "highest attempt of a trial key counts" rule lives: experiment_index is a
# table holding this query's rows (docs/data.md, "experiment_index: a table kept current"), kept
# current by every put of a trial, grade or base check (``index_refresh``, in the same
# transaction as the record's row) and rebuilt whole from the tables by a sync. Reading a stored
# row is what makes a full read of a million keys fast: joining them at read time cost 2 s and
# more (docs/performance.md, "The results store at scale"). The query itself, for a rebuild of
# a million rows as much as for one key (tests/results/test_views.py checks it against the plain
# definition):
# - an attempt is left out when a higher one of its key is stored, found in a narrow aggregate
#   over the retried keys only (attempt > 1: about a tenth), not by a window over the joined
#   wide rows;
# - the grades are joined before that anti-join, so the join builds its hash table from the
#   grades (the key, eight columns, five counts) and streams the wide trial rows through it;
# - a grade's hidden-test counts come from one parse of its JSON, cast to BIGINT before the
#   join (five integers in the hash table, not a list of strings).
_GRADE_COLUMNS = (
    "passed, trust, hidden_tests, task_invalid, contamination, tamper_signals, grader_digest, "
    "regrade_of"
)


def index_select(scope: str = "true", base_scope: str = "true") -> str:
    """experiment_index's rows, of the keys ``scope`` picks: a condition on ``experiment_id``,
    ``trial_key`` and ``task`` (the columns trials, grades and the index share; literals only,
    it is repeated per scan), ``base_scope`` the base checks' (on ``experiment_id``, ``task``).
    A scope that picks more keys than were touched is harmless: each key's row is recomputed."""
    return f"""SELECT t.experiment_id, t.trial_key, t.variant, t.task, t.replicate,
  t.attempt, t.run_id, t.retry_of, t.outcome_class, t.infra_reason, t.drift, t.verify_passed,
  g.passed, g.trust, g.hidden_tests,
  {", ".join(f"g.hidden_{k}" for k in _HIDDEN)},
  (coalesce(g.task_invalid, false) OR coalesce(b.invalid, false)) AS task_invalid,
  g.contamination, g.tamper_signals,
  t.cost_usd, t.cost_estimate_usd, t.duration_s, t.pin_set, t.model, t.agent_is_standin,
  t.reused_from, g.grader_digest, g.regrade_of,
  coalesce(t.source, 'experiment') AS source, t.shadow_of
FROM (SELECT * FROM trials WHERE {scope}) t
LEFT JOIN (
  SELECT experiment_id, trial_key, attempt, {_GRADE_COLUMNS},
    {", ".join(f"CAST(hidden[{i}] AS BIGINT) AS hidden_{k}" for i, k in enumerate(_HIDDEN, 1))}
  FROM (
    SELECT *, json_extract_string(hidden_tests, [{", ".join(f"'$.{k}'" for k in _HIDDEN)}])
      AS hidden
    FROM grades WHERE {scope})
) g
  ON g.experiment_id = t.experiment_id AND g.trial_key = t.trial_key AND g.attempt = t.attempt
ANTI JOIN (
  SELECT experiment_id, trial_key, max(attempt) AS top FROM trials WHERE attempt > 1 AND {scope}
  GROUP BY experiment_id, trial_key
) later
  ON later.experiment_id = t.experiment_id AND later.trial_key = t.trial_key
  AND t.attempt < later.top
LEFT JOIN (SELECT * FROM base_checks WHERE {base_scope}) b
  ON b.experiment_id = t.experiment_id AND b.task = t.task"""


# experiment_index's columns in order: index_select's (tests/results/test_views.py checks they
# agree); their types are those of the columns they come from.
_INDEX_NAMES = (
    "experiment_id trial_key variant task replicate attempt run_id retry_of outcome_class "
    "infra_reason drift verify_passed passed trust hidden_tests "
    + " ".join(f"hidden_{k}" for k in _HIDDEN)
    + " task_invalid contamination tamper_signals cost_usd cost_estimate_usd duration_s pin_set "
    "model agent_is_standin reused_from grader_digest regrade_of source shadow_of"
).split()


def _index_columns() -> tuple[Column, ...]:
    types = {c.name: c.sql_type for c in BY_NAME["grades"].columns} | {
        c.name: c.sql_type for c in BY_NAME["trials"].columns
    }
    types |= {f"hidden_{k}": "BIGINT" for k in _HIDDEN} | {"task_invalid": "BOOLEAN"}
    # all nullable: a key not graded yet has NULL grade columns
    return tuple(Column(n, types[n], True) for n in _INDEX_NAMES)


INDEX_COLUMNS = _index_columns()
INDEX_DDL = "CREATE TABLE IF NOT EXISTS experiment_index (\n  {}\n)".format(
    ",\n  ".join(f'"{c.name}" {c.sql_type}' for c in INDEX_COLUMNS)
)
# A database or catalog whose index was made by another definition rebuilds it (the digest is
# the table's comment in DuckDB, part of SCHEMA_DIGEST in the DuckLake).
INDEX_DIGEST = hashlib.sha256((INDEX_DDL + index_select()).encode()).hexdigest()[:16]


def _literals(values: Iterable[Any]) -> str:
    return ", ".join("'" + str(v).replace("'", "''") + "'" for v in sorted(set(values)))


def index_scope(table: str, rows: Collection[dict[str, Any]]) -> tuple[str, str] | None:
    """(scope, base_scope) for ``index_select`` / ``index_refresh``: the keys whose index rows
    ``rows`` of ``table`` can change (None: no table the index reads). Literal lists, so the
    engine prunes by them (DuckDB's zone maps, the DuckLake's partitions and file statistics):
    a put reads its experiment's rows, not the store's."""
    if table not in ("trials", "grades", "base_checks") or not rows:
        return None
    exps = f"experiment_id IN ({_literals(r['experiment_id'] for r in rows)})"
    if table == "base_checks":  # a check stored after the grade counts (task_invalid)
        return f"{exps} AND task IN ({_literals(r['task'] for r in rows)})", exps
    return f"{exps} AND trial_key IN ({_literals(r['trial_key'] for r in rows)})", exps


def index_refresh(scope: str, base_scope: str) -> list[str]:
    """The statements that make the index rows of ``scope``'s keys what ``index_select`` says:
    run in the transaction that stored the rows that changed them."""
    return [
        f"DELETE FROM experiment_index WHERE {scope}",
        f"INSERT INTO experiment_index BY NAME {index_select(scope, base_scope)}",
    ]


INDEX_REBUILD = index_refresh("true", "true")

# retries.evidence_class in SQL (tests/queue/test_retries.py checks they agree): a ran trial
# is an evidence failure without a grade, on an invalid task (its grade or its task's base
# check says so: a base check stored after the grade counts too), or when no hidden test ran.
_EXECUTION_FAILURE = "outcome_class = 'infra_error'"
_EVIDENCE_FAILURE = (
    "outcome_class <> 'infra_error' AND (passed IS NULL OR coalesce(task_invalid, false)"
    " OR coalesce(hidden_passed, 0) + coalesce(hidden_failed, 0) + coalesce(hidden_errors, 0) = 0)"
)
# A pass that carries a tamper or run signal is counted apart (report.Row.flagged).
_FLAGGED = "passed AND coalesce(json_array_length(tamper_signals), 0) > 0"
# In the headline rate (report.Row.counted, docs/report.md "What counts in a rate"):
# admissible (neither failure class) and not a flagged pass.
_COUNTED = f"NOT ({_EXECUTION_FAILURE}) AND NOT ({_EVIDENCE_FAILURE}) AND NOT ({_FLAGGED})"
# pass_rate_pts is the report's rate: the mean over tasks of each task's share of counted
# passes (stats.pass_rate), so the view and the report print the same number.
# One pass over experiment_index: counts per task first (the rate's unit), then summed per
# variant; each count is the per-task counts' sum, so the view's numbers are the row counts.
_SUMMARY_COUNTS: tuple[tuple[str, str], ...] = (
    ("trials", "true"),
    ("passed", f"{_COUNTED} AND passed"),
    ("graded", _COUNTED),
    ("invalid_task", "task_invalid"),
    *((o, f"outcome_class = '{o}'") for o in _OUTCOMES),
    ("execution_failures", _EXECUTION_FAILURE),
    ("evidence_failures", _EVIDENCE_FAILURE),
    ("admissible", f"NOT ({_EXECUTION_FAILURE}) AND NOT ({_EVIDENCE_FAILURE})"),
    ("flagged_passes", _FLAGGED),
)
SUMMARY_VIEW = f"""CREATE OR REPLACE VIEW variant_summary AS
WITH per_task AS (
  SELECT experiment_id, variant, task,
    {", ".join(f"count(*) FILTER (WHERE {w}) AS n_{c}" for c, w in _SUMMARY_COUNTS)},
    avg(CASE WHEN passed THEN 1.0 ELSE 0.0 END) FILTER (WHERE {_COUNTED}) AS rate
  FROM experiment_index
  GROUP BY experiment_id, variant, task)
SELECT experiment_id, variant,
  {", ".join(f"CAST(sum(n_{c}) AS BIGINT) AS {c}" for c, _ in _SUMMARY_COUNTS[:3])},
  round(100 * avg(rate), 1) AS pass_rate_pts,
  {", ".join(f"CAST(sum(n_{c}) AS BIGINT) AS {c}" for c, _ in _SUMMARY_COUNTS[3:])}
FROM per_task
GROUP BY experiment_id, variant"""

# The monthly eval budget's ledger: every attempt costs money (infra errors too), so it reads
# `trials`, not experiment_index; a cost counts in the UTC month its attempt finished in
# (AT TIME ZONE keeps that independent of the DuckDB session's zone). An unknown cost counts
# as its estimate: unknown is not free. A reused trial was paid once, by the experiment
# that measured it: its copies are not in the ledger.
LEDGER_VIEW = """CREATE OR REPLACE VIEW budget_ledger AS
SELECT strftime(t.finished_at AT TIME ZONE 'UTC', '%Y-%m') AS month,
  e.author, t.experiment_id, t.trial_key, t.attempt,
  coalesce(t.cost_usd, t.cost_estimate_usd, 0) AS cost_usd, t.cost_usd IS NULL AS estimated,
  t.finished_at
FROM trials t
JOIN experiments e ON e.experiment_id = t.experiment_id
WHERE t.reused_from IS NULL"""

VIEWS: tuple[str, ...] = (SUMMARY_VIEW, LEDGER_VIEW)
