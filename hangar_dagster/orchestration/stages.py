"""Stage names, run tags and partitions: what assets, jobs, sensors, schedules and the driver share.

One module so that sensors and schedules need neither the asset factory nor
the in-process driver to name a stage, tag its run or read a partition key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import dagster as dg

from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.queue.partitions import RUN_PARTITIONS, Grid, RunRange, run_range
from hangar_dagster.queue.starts import EVAL_PRIORITY, EVAL_QUEUE, QUEUE_TAG

# The setup stages' runs, in order: the spec runs inside the pin sets' run (``stage_assets``).
SETUP_STAGES = ("pin_sets", "base_checks")
TAG_EXPERIMENT = "hangar/experiment"
TAG_STAGE = "hangar/stage"
# Every trials run of an experiment carries its id here (a job tag, so a run launched from the
# UI does too): the instance's queue runs one per value at a time (dagster.yaml).
TAG_TRIALS_OF = "hangar/trials_of"
# The Dagster pool of the trials step: its limit, in the instance, is the eval share of the
# whole cluster, for queued runs and `run --wait`'s in-process ones alike (docs/queue.md).
EVAL_POOL = "hangar_eval"
# Every run that writes the index carries it: the index's own and a regrade's trials run.
TAG_INDEX = "hangar/index"
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


def job_name(exp: ResolvedExperiment, stage: str) -> str:
    return f"{exp.experiment_id}__{stage}_job"


def stage_assets(exp: ResolvedExperiment) -> dict[str, tuple[str, ...]]:
    """Each stage of ``exp`` that has a job, with the assets its run materializes, in order.

    An experiment runs in as few runs as Dagster allows, since each run costs a launch and a
    wait for the driver's next tick (docs/architecture.md, "Stage runs"): one run covers one
    partition range, and a job may not select assets of different partitions definitions. The
    spec joins the pin sets' run (by variant), the base checks have their own (by task), and
    the trials job materializes trials, grades and the index: trials and grades are
    partitioned alike (a grade follows its trial), and only the last slice of the pending work
    writes the index (``stage_tags``, ``run_selection``); the others leave it out. Three runs
    for a small experiment, not five. A regrade's trials job never runs a trial (its trials
    are stored copies, experiment/regrade.py): grades and the index. The index job stays for
    an index run alone (the trials run's index step failed, or the trials were blocked).
    """
    trials = ("trials", "grades", "index") if exp.regrade_of is None else ("grades", "index")
    return {
        "pin_sets": ("spec", "pin_sets"),
        "base_checks": ("base_checks",),
        "trials": trials,
        "index": ("index",),
    }


def setup_stages(exp: ResolvedExperiment) -> tuple[str, ...]:
    """The stages run once, in order, before any trials run."""
    return tuple(s for s in stage_assets(exp) if s in SETUP_STAGES)


def writes_index(run_tags: Mapping[str, str]) -> bool:
    """Whether a successful run with ``run_tags`` wrote the experiment's index (and report).

    ``run_tags``: all of the run's tags, its job's under its own, as Dagster stores them. A
    run of a job that has the index carries ``TAG_INDEX`` from the job; a trials slice that
    left the index out says false (``stage_tags``, ``run_selection``).
    """
    return run_tags.get(TAG_INDEX) == "true"


def run_selection(
    exp: ResolvedExperiment, stage: str, tags: Mapping[str, str]
) -> list[dg.AssetKey] | None:
    """The assets a run of ``stage`` with run tags ``tags`` materializes: None for its whole
    job, else the job's assets without the index (the tags say it does not write it)."""
    names = stage_assets(exp).get(stage, ())
    if "index" not in names or tags.get(TAG_INDEX) != "false":
        return None
    return [dg.AssetKey([exp.experiment_id, a]) for a in names if a != "index"]


def partitions(
    exp: ResolvedExperiment,
) -> tuple[
    dg.StaticPartitionsDefinition, dg.StaticPartitionsDefinition, dg.MultiPartitionsDefinition
]:
    """By variant (pin sets), by task (base checks), by variant x task_rep (trials, grades)."""
    variants = dg.StaticPartitionsDefinition(list(exp.variants))
    tasks = dg.StaticPartitionsDefinition(list(exp.tasks))
    task_reps = dg.StaticPartitionsDefinition(
        [f"{t}.r{r}" for t in exp.tasks for r in range(1, exp.spec.trials + 1)]
    )
    return (
        variants,
        tasks,
        dg.MultiPartitionsDefinition({"variant": variants, "task_rep": task_reps}),
    )


def trial_key_of(trials_def: dg.MultiPartitionsDefinition, partition_key: str) -> TrialKey:
    dims = trials_def.get_partition_key_from_str(partition_key).keys_by_dimension
    return TrialKey.from_partition(dims["variant"], dims["task_rep"])


def partition_key_of(key: TrialKey) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"variant": key.variant, "task_rep": key.task_rep})


def job_tags(exp: ResolvedExperiment, stage: str) -> dict[str, str]:
    """The tags every run of a stage's job carries, however it is launched."""
    tags = {TAG_EXPERIMENT: exp.experiment_id, TAG_STAGE: stage}
    if "index" in stage_assets(exp).get(stage, ()):
        tags[TAG_INDEX] = "true"
    if stage == "trials":
        tags |= {QUEUE_TAG: EVAL_QUEUE, "dagster/priority": EVAL_PRIORITY}
        tags[TAG_TRIALS_OF] = exp.experiment_id
    return tags


def _rows_and_columns(exp: ResolvedExperiment) -> tuple[list[str], list[str]]:
    """The trials partitions' task_reps and variants, each in partition order."""
    *_, trials_def = partitions(exp)
    dims = {d.name: d.partitions_def.get_partition_keys() for d in trials_def.partitions_defs}
    return list(dims["task_rep"]), list(dims["variant"])


def grid(exp: ResolvedExperiment) -> Grid:
    """The trials partitions' rows and columns (``queue.partitions.Grid``)."""
    return Grid(*_rows_and_columns(exp))


def trials_span(
    exp: ResolvedExperiment, due: Iterable[TrialKey], limit: int = RUN_PARTITIONS
) -> RunRange | None:
    """The rectangle of the next trials run over ``due`` (``queue.partitions.run_range``)."""
    return run_range(*_rows_and_columns(exp), due, limit)


def run_span(exp: ResolvedExperiment, tags: Mapping[str, str]) -> RunRange | None:
    """The rectangle a trials run covers, read back from its tags (``span_tags``); None when
    they name no range (a run of the whole job, e.g. launched from the UI)."""
    start, end = tags.get(RANGE_START), tags.get(RANGE_END)
    if start is None or end is None:
        return None
    *_, trials_def = partitions(exp)
    first, last = (trials_def.get_partition_key_from_str(k).keys_by_dimension for k in (start, end))
    rows, columns = _rows_and_columns(exp)
    height = rows.index(last["task_rep"]) - rows.index(first["task_rep"]) + 1
    width = columns.index(last["variant"]) - columns.index(first["variant"]) + 1
    return RunRange(
        (first["task_rep"], last["task_rep"]),
        (first["variant"], last["variant"]),
        height * width,
        tags.get(TAG_INDEX) != "false",
    )


def span_tags(span: RunRange) -> dict[str, str]:
    """A trials run's tags over ``span``: its range, whether it writes the index, the eval queue."""
    start = dg.MultiPartitionKey({"task_rep": span.task_reps[0], "variant": span.variants[0]})
    end = dg.MultiPartitionKey({"task_rep": span.task_reps[1], "variant": span.variants[1]})
    return {
        RANGE_START: str(start),
        RANGE_END: str(end),
        TAG_INDEX: str(span.last).lower(),
        QUEUE_TAG: EVAL_QUEUE,
        "dagster/priority": EVAL_PRIORITY,
    }


def stage_tags(
    exp: ResolvedExperiment,
    stage: str,
    due: Iterable[TrialKey] | None = None,
    limit: int = RUN_PARTITIONS,
) -> dict[str, str]:
    """The tags of a stage's run: which partitions it covers and, for trials, the eval queue.

    Setup stages cover all their partitions. A trials run given ``due`` (the keys it should
    start or grade) covers only the next slice of them (``queue.partitions.run_range``): a
    run's cost in Dagster grows with its range, so a 50,000-partition experiment runs in slices
    and a relaunch costs what it runs. Without ``due`` it covers every partition. ``limit``:
    the slice's size (``Settings.run_partitions``). The slice that covers every due key is the
    last: it writes the index (``TAG_INDEX`` true); an earlier one does not (false), since the
    next slice's run follows it at once and rewrites it.
    """
    variants_def, tasks_def, trials_def = partitions(exp)
    by_stage = {"pin_sets": variants_def, "base_checks": tasks_def, "trials": trials_def}
    part = by_stage.get(stage)
    if part is None:
        return {}
    if stage == "trials" and due is not None:
        span = trials_span(exp, due, limit)
        if span is None:
            raise ValueError(f"a trials run of {exp.experiment_id} was asked for no due key")
        tags = span_tags(span)
    else:
        keys = part.get_partition_keys()
        tags = {RANGE_START: keys[0], RANGE_END: keys[-1]}
    if stage == "trials":
        tags |= {QUEUE_TAG: EVAL_QUEUE, "dagster/priority": EVAL_PRIORITY}
    return tags
