"""The Inspect AI side of benchmarks/inspect_compare.py: the trivial trial as an Inspect task.

It runs in Inspect's own virtualenv (``inspect eval inspect_task.py -T config=...``), never in
hangar's. Per sample, on the host in Inspect's ``local`` sandbox (a fresh temporary directory,
no isolation), two commands, as Inspect runs them:

- the solver: the task repo's files at ``base`` copied into the sample's directory, then the
  agent command (the same command hangar's `command` harness runs), in one ``sh -c``;
- the scorer: the task's hidden tests with pytest, from the sample's directory.

No model is called (the model is Inspect's ``mockllm/model``; the agent is a command, as in
hangar's harness). The config file (JSON) holds the samples' metadata, the agent command and
the python that runs pytest (hangar's runner environment's: both sides run the same pytest).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Scorer, Target, accuracy, scorer
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import sandbox


@task
def trivial(config: str) -> Task:
    cfg = json.loads(Path(config).read_text())
    samples = [
        Sample(id=i, input=s["task"], metadata=s) for i, s in enumerate(cfg["samples"], start=1)
    ]
    return Task(
        dataset=samples,
        solver=agent(cfg["agent"]),
        scorer=hidden_tests(cfg["python"]),
        sandbox="local",
    )


@solver
def agent(command: str) -> Solver:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        base = shlex.quote(state.metadata["base"])
        result = await sandbox().exec(["sh", "-c", f"cp -R {base}/. . && {command}"])
        if not result.success:
            raise RuntimeError(f"agent failed ({result.returncode}): {result.stderr[-500:]}")
        return state

    return solve


@scorer(metrics=[accuracy()])
def hidden_tests(python: str) -> Scorer:
    async def score(state: TaskState, target: Target) -> Score:
        # No cache or bytecode written beside the hidden tests: every sample shares them.
        result = await sandbox().exec(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", state.metadata["hidden"]],
            env={"PYTHONDONTWRITEBYTECODE": "1"},
        )
        return Score(
            value=CORRECT if result.success else INCORRECT,
            metadata={"returncode": result.returncode},
        )

    return score
