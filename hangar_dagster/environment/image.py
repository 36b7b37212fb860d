"""The base image for the Docker sandbox, built offline: a Debian rootfs imported with the Engine API.

No image registry is reachable from the machines hangar runs on, so the base
image is made from Debian's own packages: ``debootstrap --variant=minbase``
(python3, python3-venv, git, ca-certificates) from the mirror apt on the host
uses, the host's CA bundle copied in (so pip inside trusts what the host
trusts, the package mirror included), then the tree is streamed as a tar to
the engine's image import. The image is tagged ``hangar-base:bookworm`` and
labelled ``hangar.recipe`` with a digest of everything that went into it; a
build whose recipe digest matches the label of the existing image is a cache
hit and does nothing. The result is an ordinary image: ``docker save`` /
``load`` or a registry carry it to another machine, and a machine that can
pull an image can use any Debian bookworm image instead (the sandbox binds
the host's Python runtime, so the image needs only bookworm's libraries).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hangar_dagster.util.digests import sha256_json

BASE_REPOSITORY = "hangar-base"
BASE_TAG = "bookworm"
BASE_IMAGE = f"{BASE_REPOSITORY}:{BASE_TAG}"
RECIPE_LABEL = "hangar.recipe"
SUITE = "bookworm"
INCLUDE = ("python3", "python3-venv", "git", "ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
# Bump when the way the rootfs is made changes: a new recipe digest, so a rebuild.
_RECIPE_VERSION = 2


class ImageBuildError(RuntimeError):
    """The base image could not be built (no debootstrap, no root, the mirror unreachable, ...)."""


@dataclass(frozen=True)
class BuiltImage:
    image_id: str  # sha256:..., what environment.image pins
    tag: str
    recipe_digest: str
    cached: bool  # the existing image already had this recipe


def debian_mirror(sources: Path = _SOURCES) -> str:
    """The first ``URIs:`` of apt's deb822 sources on the host (the mirror apt uses), or Debian's."""
    try:
        text = sources.read_text()
    except OSError:
        return DEFAULT_MIRROR
    found = re.search(r"^URIs:\s*(\S+)", text, re.MULTILINE)
    return found.group(1) if found else DEFAULT_MIRROR


def recipe(mirror: str | None = None, ca_bundle: Path = CA_BUNDLE) -> dict[str, Any]:
    ca = hashlib.sha256(ca_bundle.read_bytes()).hexdigest() if ca_bundle.is_file() else None
    return {
        "version": _RECIPE_VERSION,
        "suite": SUITE,
        "variant": "minbase",
        "include": list(INCLUDE),
        "mirror": mirror or debian_mirror(),
        "ca_bundle_sha256": ca,
    }


def recipe_digest(spec: dict[str, Any]) -> str:
    return "sha256:" + sha256_json(spec)


def debootstrap(target: Path, mirror: str, log: Callable[[str], None]) -> None:
    exe = shutil.which("debootstrap")
    if exe is None:
        raise ImageBuildError(
            "debootstrap is not installed: apt-get install debootstrap (scripts/bootstrap does)"
        )
    if os.geteuid() != 0:
        raise ImageBuildError("debootstrap needs root to build the base image's rootfs")
    argv = [exe, "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE, str(target), mirror]
    log(f"hangar: {' '.join(argv)} (a few minutes)")
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise ImageBuildError(f"debootstrap failed (exit {proc.returncode}):\n" + "\n".join(tail))


def _tar_rootfs(rootfs: Path, ca_bundle: Path, out: Path) -> None:
    """The rootfs as a tar (owners, modes, links kept), the host's CA bundle replacing its own."""
    bundle = "etc/ssl/certs/ca-certificates.crt"

    def skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        # The image's own bundle gives way to the host's (a tar must not hold a path twice).
        if info.name == bundle and ca_bundle.is_file():
            return None
        if info.name == "root":
            # A host runtime under /root (pyenv) is bound there: the sandbox's user must cross it.
            info.mode = 0o755
        return info

    with tarfile.open(out, "w") as tar:
        for entry in sorted(os.listdir(rootfs)):
            # The engine provides /proc, /sys and /dev itself.
            if entry in ("proc", "sys", "dev"):
                info = tarfile.TarInfo(entry)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            tar.add(rootfs / entry, arcname=entry, recursive=True, filter=skip)
        if ca_bundle.is_file():
            info = tar.gettarinfo(str(ca_bundle), arcname=bundle)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o644
            with ca_bundle.open("rb") as f:
                tar.addfile(info, f)


def cached_image(client: Any, digest: str, ref: str = BASE_IMAGE) -> str | None:
    """The id of the image ``ref`` (the base image) if it exists and was built from the recipe
    ``digest``."""
    import docker.errors

    try:
        image = client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None
    labels = (image.attrs.get("Config") or {}).get("Labels") or {}
    return str(image.id) if labels.get(RECIPE_LABEL) == digest else None


def build_base_image(
    client: Any,
    *,
    rootfs: Path | None = None,
    mirror: str | None = None,
    ca_bundle: Path = CA_BUNDLE,
    log: Callable[[str], None] = print,
) -> BuiltImage:
    """Build (or find cached) ``hangar-base:bookworm``; ``rootfs``: an existing debootstrap tree.

    ``rootfs`` is for a tree made by the same recipe (a warm cache); without it the
    tree is debootstrapped from nothing into a temporary directory.
    """
    spec = recipe(mirror, ca_bundle)
    digest = recipe_digest(spec)
    found = cached_image(client, digest)
    if found is not None:
        return BuiltImage(found, BASE_IMAGE, digest, cached=True)
    with tempfile.TemporaryDirectory(prefix="hangar-image-") as tmp:
        tree = rootfs
        if tree is None:
            tree = Path(tmp) / "rootfs"
            debootstrap(tree, spec["mirror"], log)
        elif not (tree / "usr" / "bin" / "python3").exists():
            raise ImageBuildError(f"--rootfs {tree}: not a Debian rootfs with python3 in it")
        tar_path = Path(tmp) / "rootfs.tar"
        log("hangar: importing the rootfs into the Docker engine")
        _tar_rootfs(tree, ca_bundle, tar_path)
        changes = [f"LABEL {RECIPE_LABEL}={digest}", 'CMD ["/bin/sh"]']
        client.api.import_image_from_file(
            str(tar_path), repository=BASE_REPOSITORY, tag=BASE_TAG, changes=changes
        )
    image = client.images.get(BASE_IMAGE)
    return BuiltImage(str(image.id), BASE_IMAGE, digest, cached=False)


class ImageRefError(ValueError):
    """``environment.image`` cannot be pinned: ``fix`` says what to write instead."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_REPO_DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


def is_digest(ref: str | None) -> bool:
    """Whether ``ref`` names an image by content: ``repo@sha256:...`` or an id ``sha256:...``."""
    return ref is not None and bool(_REPO_DIGEST.match(ref) or _ID.match(ref))


def pin_image(ref: str | None, client: Any | None = None) -> str:
    """What ``environment.image`` is pinned to at submit: a digest, never a tag.

    ``repo@sha256:...`` is kept as given (a registry digest; the engine may pull it
    elsewhere). A local image id ``sha256:...`` is looked up: pinned as its repo digest
    when it has one, else as the id, itself a digest of the image's content. A tag is
    refused, with the digest it resolves to now.
    """
    import docker.errors

    from hangar_dagster.trials.sandbox.docker import client as engine

    if ref is None:
        raise ImageRefError(
            "environment.sandbox docker needs environment.image (a digest)",
            "run `hangar image build` and set image: to the sha256:... it prints",
        )
    if _REPO_DIGEST.match(ref):
        return ref
    c = client if client is not None else engine()
    try:
        image = c.images.get(ref)
    except docker.errors.ImageNotFound:
        if _ID.match(ref):
            raise ImageRefError(
                f"image {ref} is not on this Docker engine",
                "run `hangar image build` (the base image) or `docker pull` the image first",
            ) from None
        raise ImageRefError(
            f"image {ref!r} is a tag, not a digest, and this Docker engine does not have it",
            "pin the image by digest: repo@sha256:... or the sha256:... id `docker images "
            "--no-trunc` shows",
        ) from None
    if not _ID.match(ref):
        raise ImageRefError(
            f"image {ref!r} is a tag, not a digest: a tag can move between trials",
            f"pin what it resolves to now: image: {_pinned_form(image)}",
        )
    return _pinned_form(image)


def _pinned_form(image: Any) -> str:
    digests = image.attrs.get("RepoDigests") or []
    return str(digests[0]) if digests else str(image.id)
