"""``hangar image``: the Docker sandbox's base image, built offline (environment/image.py).

``build`` debootstraps Debian bookworm (python3, git, ca-certificates), copies the host's CA
bundle in, imports the tree into the Docker engine as ``hangar-base:bookworm`` and prints the
image id to pin as ``environment.image``; run again it is a cache hit while the recipe is the
same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(no_args_is_help=True, help="The Docker sandbox's base image.")
err = Console(stderr=True, soft_wrap=True)


@app.command("build")
def build_cmd(
    rootfs: Annotated[
        Path | None,
        typer.Option(
            help="Import this debootstrapped tree (made by the same recipe) instead of "
            "running debootstrap.",
            exists=True,
            file_okay=False,
        ),
    ] = None,
    mirror: Annotated[
        str | None,
        typer.Option(help="Debian mirror for debootstrap (default: the one apt uses here)."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the image id.")] = False,
) -> None:
    """Build the base image (or find it cached) and print its id for environment.image."""
    from hangar_dagster.environment.image import ImageBuildError, build_base_image
    from hangar_dagster.trials.sandbox import SandboxUnavailable
    from hangar_dagster.trials.sandbox.docker import client

    def say(msg: str) -> None:
        if not quiet:
            err.print(escape(msg))

    try:
        built = build_base_image(client(), rootfs=rootfs, mirror=mirror, log=say)
    except (ImageBuildError, SandboxUnavailable) as e:
        err.print(f"[red]hangar image build:[/] {escape(str(e))}")
        raise typer.Exit(1) from None
    if quiet:
        print(built.image_id)
        return
    how = "cached (same recipe)" if built.cached else "built"
    say(f"{built.tag}: {how}, recipe {built.recipe_digest}")
    print(f"environment:\n  sandbox: docker\n  image: {built.image_id}")
