"""Build the deployment's images (or find them cached): `python deploy/docker/build.py [--tag T]`.

The project image (printed: its id, what a spec pins as environment.image) and the Postgres
image (--postgres-tag; Debian's postgresql-15 on the same base image), each cached by a recipe. The context, the wheels and the recipe label are made by
hangar_dagster/environment/project_image.py (docs/operations.md, "Beyond one machine: Docker");
the dependency wheels are kept under --wheels (default ~/.cache/hangar/deploy-wheels) per
dependency list, so a change to hangar's code alone downloads nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hangar_dagster.environment.image import ImageBuildError
from hangar_dagster.environment.project_image import (
    POSTGRES_IMAGE,
    PROJECT_IMAGE,
    build_postgres_image,
    build_project_image,
)
from hangar_dagster.trials.sandbox import SandboxUnavailable
from hangar_dagster.trials.sandbox.docker import client

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default=PROJECT_IMAGE)
    parser.add_argument("--postgres-tag", default=POSTGRES_IMAGE)
    parser.add_argument("--wheels", type=Path, default=Path("~/.cache/hangar/deploy-wheels"))
    args = parser.parse_args()
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731  stdout: the id alone
    try:
        built = build_project_image(
            client(), source=REPO, wheels_cache=args.wheels.expanduser(), tag=args.tag, log=log
        )
        postgres = build_postgres_image(client(), source=REPO, tag=args.postgres_tag, log=log)
    except (ImageBuildError, SandboxUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for image in (built, postgres):
        log(f"{image.tag}: {'cached' if image.cached else 'built'} (recipe {image.recipe_digest})")
    print(built.image_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
