"""``stage()``: the library call behind ``ocistage stage`` — one entry point for every source
and target.

``what`` is resolved first, by one rule: anything that looks like a path is a path.

- a URL (``file://``, ``memory://``, ``sftp://``, ``s3://`` ...) names a squashfs image to fetch;
- an existing directory is staged as it is (a bundle, or any tree);
- something that looks like a path (``/x``, ``./x``, ``../x``, ``~/x``, ``x/`` or ``a/b`` whose
  ``a`` is a directory here) and is not a directory is an error: *no such directory*;
- an image reference is bundled into the cache first
(:func:`ocistage.bundler.flows.bundle.make_bundle`) —
  but only one that names its registry (``docker.io/library/alpine``, ``localhost:5000/x``) or
  its transport (``docker://alpine``, ``oci:``, ``oci-archive:``, ``docker-archive:``). A bare
  name such as ``mybundle`` is most likely a mistyped directory; as skopeo does, ocistage does
  not guess Docker Hub for it (a careful podman refuses ambiguous short names too).

Then it is staged on this node (:func:`ocistage.stagers.directory.stage_directory`,
:func:`ocistage.stagers.remote.stage_from_url`), stored at a URL
(:func:`ocistage.stagers.remote.push_tree`), or
staged on every node of the Slurm allocation (:func:`ocistage.stagers.allnodes.stage_all_nodes`).

This module is why ``bundler`` imports ``stagers`` (docs/architecture.md): a REF must become
a bundle before it can be staged, and ``stagers`` knows nothing of images.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ocistage.cache.leases import InUse
from ocistage.errors import UsageError
from ocistage.stagers.errors import StageUsageError

if TYPE_CHECKING:
    from ocistage.bundler.image.reference import ImageSource
    from ocistage.bundler.pull import PullOptions, PullProgress
    from ocistage.cache.notice import Notice
    from ocistage.cache.store import Store
    from ocistage.results import JsonDoc, Renderer
    from ocistage.stagers.allnodes import NodeResult
    from ocistage.stagers.mksquashfs import ImageProgress
    from ocistage.stagers.remote import PushResult
    from ocistage.stagers.target import StageResult

#: explicit transports of an image reference (ocistage.bundler.image.reference)
_TRANSPORTS = ("docker://", "oci:", "oci-archive:", "docker-archive:")


@dataclass(frozen=True)
class StageOptions:
    to: str                       # a directory, or an fsspec URL to store the bundle at
    format: str = "dir"           # dir | squashfs
    name: str | None = None       # default: the source directory's name
    pin: str | None = None        # default holder: the Slurm job, else the pin stage:USER
    all_nodes: bool = False
    node_local: bool = False      # TO is this node's own (a node's stager of --all-nodes)
    link: bool | None = None      # True: only hardlinks; False: independent copies
    mount: bool | None = None     # squashfs: True mount, False unpack, None either
    jobs: int = 8


@dataclass(frozen=True)
class Staged:
    label: str                    # what was staged: the REF, directory or URL
    outcome: StageResult | PushResult | list[NodeResult]
    warnings: tuple[Notice, ...] = ()   # from bundling a REF

    def to_json(self) -> JsonDoc:
        """What ``stage --json`` prints: the staged bundle, the URL stored at, or a list of
        the nodes' results (``--all-nodes``)."""
        from ocistage.stagers.allnodes import node_name
        from ocistage.stagers.target import StageResult  # (remote's PushResult: not loaded)

        outcome = self.outcome
        if isinstance(outcome, list):
            return [r.result for r in outcome]
        if not isinstance(outcome, StageResult):
            return outcome.to_json()
        return {"path": str(outcome.path), "source": self.label, "node": node_name(),
                "method": outcome.method, "files": outcome.files, "copied": outcome.copied,
                "linked": outcome.linked, "unchanged": outcome.unchanged,
                "bytes_copied": outcome.bytes_copied, "lease_id": outcome.lease_id}

    def render(self, out: Renderer) -> None:
        from ocistage.cache.sizes import count, format_size
        from ocistage.stagers.target import StageResult

        outcome = self.outcome
        if isinstance(outcome, list):  # --all-nodes: one result per node
            for r in outcome:
                out.line(f"{r.node}: {r.result.get('path')}")
            return
        if not isinstance(outcome, StageResult):
            outcome.render(out)
            return
        out.note(f"staged {self.label} ({outcome.method}: {count(outcome.files, 'file')}, "
                 f"{outcome.copied} copied ({format_size(outcome.bytes_copied)}), "
                 f"{outcome.linked} linked, {outcome.unchanged} unchanged)")
        out.line(str(outcome.path))


ProgressFactory = Callable[[], AbstractContextManager["PullProgress | None"]]


def stage(what: str, options: StageOptions, *, store: Store,
          pull_options: Callable[[], PullOptions] | None = None,
          progress: ProgressFactory | None = None,
          image_progress: ImageProgress | None = None) -> Staged:
    """Resolve ``what`` (module docstring) and stage it as ``options`` say.

    ``pull_options`` and ``progress`` are called only when a REF is bundled (staging a
    directory loads no registry client); ``image_progress`` is told (files done, files) while
    a squashfs image is built on this node."""
    if options.format not in ("dir", "squashfs"):
        raise UsageError(f"unknown format {options.format!r}",
                         "use --format dir or --format squashfs")
    if options.all_nodes:
        from ocistage.stagers.allnodes import check_all_nodes

        check_all_nodes()  # before the REF is resolved: refused where it would run N times
    # a REF's cached bundle stays leased until it is staged: a gc (another member's, in a
    # group-shared cache) would otherwise evict it from under the copy
    with InUse(store.root) as in_use:
        source, label, warnings, name = _resolve(what, store, pull_options, progress, in_use)
        if options.name is None and name is not None:
            options = dataclasses.replace(options, name=name)
        outcome = _dispatch(source, label, options, store, image_progress)
    if isinstance(outcome, list) and options.pin is None:
        from ocistage.bundler.flows.nodecleanup import queue_node_cleanups

        warnings += queue_node_cleanups(outcome, store.root)
    return Staged(label, outcome, warnings)


def _resolve(what: str, store: Store, pull_options: Callable[[], PullOptions] | None,
             progress: ProgressFactory | None, in_use: InUse,
             ) -> tuple[Path | str, str, tuple[Notice, ...], str | None]:
    """The directory (or URL) to stage, its label, warnings of making it, and the name to
    stage it under if ``--name`` is not given (a REF's :func:`default_name`; else None: the
    directory's name). A REF's bundle is made under ``in_use``."""
    from ocistage.stagers.urls import is_url

    if is_url(what):
        return what, what, (), None
    path = Path(os.path.expanduser(what))
    if path.is_dir():
        return path.absolute(), os.fspath(path.absolute()), (), None
    if _looks_like_path(what):
        if os.path.lexists(path):
            raise StageUsageError(f"{what} is not a directory",
                                  "stage a bundle directory, a tree, a squashfs image URL "
                                  "(file://...) or an image reference")
        raise StageUsageError(f"no such directory: {what}",
                              "give an existing bundle directory, or an image reference")
    from ocistage.bundler.flows.bundle import make_bundle
    from ocistage.bundler.image.reference import RegistryReference, parse_reference

    reference = parse_reference(what)
    if isinstance(reference, RegistryReference) and not _names_registry(what):
        raise StageUsageError(f"no such directory: {what}",
                              f"to stage the image {reference}, name its registry: "
                              f"{reference.registry}/{reference.repository} or "
                              f"docker://{what}")
    with (progress or contextlib.nullcontext)() as bars:
        bundle = make_bundle(reference, store, None,
                             pull_options=pull_options() if pull_options else None,
                             progress=bars, in_use=in_use)
    return bundle.path, what, tuple(bundle.warnings), default_name(reference)


def default_name(reference: ImageSource) -> str | None:
    """The staged name of an image reference without ``--name``: its repository and tag (or
    digest) joined by ``+`` as enroot names its images (``debian+bookworm``,
    ``team+app+1.2``, ``app+sha256-0123456789ab``; Docker Hub's ``library/`` left out), so
    that staging a newer image of the tag replaces the previous one. None when no such name
    can be made (then the bundle's own name is used)."""
    from ocistage.bundler.image.reference import (
        DEFAULT_REGISTRY,
        OFFICIAL_REPOSITORY_PREFIX,
        DockerArchiveReference,
        RegistryReference,
        parse_registry_reference,
    )
    from ocistage.stagers.target import check_name

    if isinstance(reference, RegistryReference):
        repository = reference.repository
        if reference.registry == DEFAULT_REGISTRY:
            repository = repository.removeprefix(OFFICIAL_REPOSITORY_PREFIX)
        version = reference.tag or (f"{reference.digest.algorithm}-{reference.digest.hex[:12]}"
                                    if reference.digest else "")
        name = "+".join([*repository.split("/"), version])
    elif isinstance(reference, DockerArchiveReference) and reference.image:
        return default_name(parse_registry_reference(reference.image))
    else:
        stem = reference.path.name.removesuffix(".tar")
        tag = getattr(reference, "tag", None)
        name = f"{stem}+{tag}" if tag else stem
    try:
        return check_name(name)
    except UsageError:
        return None


def _looks_like_path(what: str) -> bool:
    if what in (".", "..") or what.startswith(("/", "./", "../", "~")) or what.endswith("/"):
        return True
    first, slash, _ = what.partition("/")
    return bool(slash) and os.path.isdir(first)


def _names_registry(what: str) -> bool:
    """Whether a registry reference names its registry or transport (not a short name)."""
    if what.startswith(_TRANSPORTS):
        return True
    first, slash, _ = what.partition("/")
    return bool(slash) and (any(c in first for c in ".:") or first == "localhost")


def _dispatch(source: Path | str, label: str, options: StageOptions, store: Store,
              image_progress: ImageProgress | None,
              ) -> StageResult | PushResult | list[NodeResult]:
    from ocistage.stagers.markers import default_holder
    from ocistage.stagers.urls import is_url

    cache_root = store.root
    if options.all_nodes:
        from ocistage.stagers.allnodes import stage_all_nodes

        return stage_all_nodes(_node_argv(os.fspath(source), options, cache_root.absolute()))
    if is_url(options.to):
        from ocistage.stagers.remote import push_tree

        if not isinstance(source, Path):
            raise UsageError(f"cannot stage {label} to another URL",
                             "stage from a bundle, a directory or a REF to a URL")
        work = store.temp_dir("push")  # owned by this process: removed if we die
        try:
            return push_tree(source, options.to, options.name or source.name,
                             format=options.format, work=work, label=label, jobs=options.jobs)
        finally:
            store.remove_temp_dir(work)
    holder = default_holder(options.pin)
    if isinstance(source, str):
        from ocistage.stagers.remote import stage_from_url

        return stage_from_url(source, Path(options.to), cache_root=cache_root,
                              name=options.name, holder=holder, mount_image=options.mount,
                              local=options.node_local)
    from ocistage.stagers.directory import stage_directory

    return stage_directory(source, Path(options.to), cache_root=cache_root, name=options.name,
                           holder=holder, link=options.link, jobs=options.jobs,
                           format="squashfs" if options.format == "squashfs" else "dir",
                           source_label=label, squashfs_mount=options.mount,
                           image_progress=image_progress, local=options.node_local)


def _node_argv(source: str, options: StageOptions, cache_root: Path) -> list[str]:
    """The ``ocistage stage`` argv each node runs: the resolved source, one JSON line out."""
    command = shutil.which("ocistage")
    argv = [command] if command else [sys.executable, "-m", "ocistage.bundler.cli.app"]
    argv += ["stage", source, "--to", options.to, "--cache", os.fspath(cache_root),
             "--json-lines", "--node-local", "--format", options.format, "--jobs",
             str(options.jobs)]
    if options.name is not None:
        argv += ["--name", options.name]
    if options.pin is not None:
        argv += ["--pin", options.pin]
    if options.link is not None:
        argv.append("--link" if options.link else "--copy")
    if options.mount is not None:
        argv.append("--mount" if options.mount else "--unpack")
    return argv
