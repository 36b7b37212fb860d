"""The project's image (deploy/docker/Dockerfile), built offline and cached by a recipe label.

Like the base image (environment/image.py): the image is labelled ``hangar.recipe`` with a
digest of everything that goes into it (the base image's id, the deploy files, hangar's
sources, its dependency list), and a build whose digest matches the image under the tag is a
cache hit that does nothing. Here because it is an image of the environment a run runs in,
next to the base image it is built on; deploy/docker/build.py is the operator's command, the
tests call the same function.

The build context is made without any index in the image build: hangar's own wheel from a
copy of its sources (``pip wheel --no-deps``, so a stale ``build/`` is never packed) and its
dependencies (``pip download``, through the host's pip configuration) into a directory cached
by the dependency list, so a change to hangar's code alone neither downloads nor reinstalls
them (the Dockerfile installs them in a layer of their own).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hangar_dagster.environment.image import (
    BASE_IMAGE,
    RECIPE_LABEL,
    BuiltImage,
    ImageBuildError,
    cached_image,
    recipe_digest,
)

PROJECT_IMAGE = "hangar-dagster:local"
POSTGRES_IMAGE = "hangar-postgres:local"
DEPLOY_FILES = ("Dockerfile", "dagster.yaml", "workspace.yaml")
POSTGRES_FILES = ("Dockerfile.postgres", "postgres-entrypoint.sh")
# Bump when the way the context is made changes.
_RECIPE_VERSION = 1


def _sources(source: Path) -> Iterator[Path]:
    """What hangar's wheel is made of: pyproject.toml and the package, bytecode left out."""
    yield source / "pyproject.toml"
    for path in sorted((source / "hangar_dagster").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path


def _files_digest(root: Path, files: Iterator[Path]) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def requirements(source: Path) -> str:
    """hangar's dependencies as a requirements file (pyproject.toml's list, in order)."""
    deps = tomllib.loads((source / "pyproject.toml").read_text())["project"]["dependencies"]
    return "".join(f"{d}\n" for d in deps)


def _base_id(client: Any) -> str:
    import docker.errors

    try:
        return str(client.images.get(BASE_IMAGE).id)
    except docker.errors.ImageNotFound:
        raise ImageBuildError(
            f"{BASE_IMAGE} is not on this Docker engine: run `hangar image build` first"
        ) from None


def recipe(client: Any, source: Path) -> dict[str, Any]:
    deploy = source / "deploy" / "docker"
    return {
        "version": _RECIPE_VERSION,
        "base": _base_id(client),
        "deploy": _files_digest(deploy, (deploy / f for f in DEPLOY_FILES)),
        "sources": _files_digest(source, _sources(source)),
        "requirements": requirements(source),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def _pip(args: list[str], log: Callable[[str], None]) -> None:
    argv = [sys.executable, "-m", "pip", *args]
    log(f"hangar: {' '.join(argv)}")
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise ImageBuildError(f"pip {args[0]} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def dependency_wheels(source: Path, cache: Path, log: Callable[[str], None] = print) -> Path:
    """A directory of every dependency's distribution and its requirements.txt, made once per
    dependency list (and Python version) under ``cache``."""
    reqs = requirements(source)
    key = hashlib.sha256(f"{sys.version_info[:2]}\n{reqs}".encode()).hexdigest()[:16]
    done = cache / f"deps-{key}"
    if (done / "requirements.txt").is_file():
        return done
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".deps-{key}-", dir=cache))
    try:
        (tmp / "reqs.in").write_text(reqs)
        _pip(["download", "-q", "-d", str(tmp), "-r", str(tmp / "reqs.in")], log)
        # Written last: its presence says the directory is complete.
        (tmp / "reqs.in").rename(tmp / "requirements.txt")
        try:
            tmp.rename(done)
        except OSError:  # another process finished the same one first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return done


def _link_tree(src: Path, dest: Path) -> None:
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dest, copy_function=link)


def _docker_build(
    client: Any, context: Path, tag: str, digest: str, dockerfile: str = "Dockerfile"
) -> None:
    stream = client.api.build(
        path=str(context),
        dockerfile=dockerfile,
        tag=tag,
        labels={RECIPE_LABEL: digest},
        rm=True,
        decode=True,
    )
    tail: list[str] = []
    for chunk in stream:
        if "error" in chunk:
            raise ImageBuildError(
                f"docker build of {tag} failed: {chunk['error']}\n" + "".join(tail[-15:])
            )
        if "stream" in chunk:
            tail.append(str(chunk["stream"]))


def build_project_image(
    client: Any,
    *,
    source: Path,
    wheels_cache: Path,
    tag: str = PROJECT_IMAGE,
    log: Callable[[str], None] = print,
) -> BuiltImage:
    """Build (or find cached) the project image of the checkout ``source`` under ``tag``."""
    digest = recipe_digest(recipe(client, source))
    found = cached_image(client, digest, tag)
    if found is not None:
        return BuiltImage(found, tag, digest, cached=True)
    deps = dependency_wheels(source, wheels_cache, log)
    with tempfile.TemporaryDirectory(prefix="hangar-project-image-") as tmp:
        context, src = Path(tmp) / "context", Path(tmp) / "src"
        context.mkdir()
        for name in DEPLOY_FILES:
            shutil.copy2(source / "deploy" / "docker" / name, context / name)
        _link_tree(deps, context / "wheels" / "deps")
        # A clean copy of the sources: what the digest covers, and nothing a stale build/ holds.
        for path in _sources(source):
            dest = src / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        wheels = context / "wheels" / "hangar"
        _pip(["wheel", "-q", "--no-deps", "-w", str(wheels), str(src)], log)
        log(f"hangar: docker build -t {tag} (recipe {digest[:19]})")
        _docker_build(client, context, tag, digest)
    image = client.images.get(tag)
    return BuiltImage(str(image.id), tag, digest, cached=False)


def build_postgres_image(
    client: Any, *, source: Path, tag: str = POSTGRES_IMAGE, log: Callable[[str], None] = print
) -> BuiltImage:
    """Build (or find cached) the deployment's Postgres image (deploy/docker/Dockerfile.postgres).

    Its recipe is the base image's id and the two files; Debian's postgresql-15 package comes
    from the host's apt mirror at build time, so a rebuild may get a newer point release.
    """
    deploy = source / "deploy" / "docker"
    digest = recipe_digest(
        {
            "version": _RECIPE_VERSION,
            "base": _base_id(client),
            "files": _files_digest(deploy, (deploy / f for f in POSTGRES_FILES)),
        }
    )
    found = cached_image(client, digest, tag)
    if found is not None:
        return BuiltImage(found, tag, digest, cached=True)
    with tempfile.TemporaryDirectory(prefix="hangar-postgres-image-") as tmp:
        for name in POSTGRES_FILES:
            shutil.copy2(deploy / name, Path(tmp) / name)
        log(f"hangar: docker build -f Dockerfile.postgres -t {tag} (recipe {digest[:19]})")
        _docker_build(client, Path(tmp), tag, digest, dockerfile="Dockerfile.postgres")
    return BuiltImage(str(client.images.get(tag).id), tag, digest, cached=False)
