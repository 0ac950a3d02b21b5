"""The caller's overrides of an image config for its ``config.json``: :class:`ConfigOptions`.

A value type of its own, apart from :mod:`ocistage.bundler.runtime_config` that applies it: a
bundle is keyed by these options (:mod:`ocistage.bundler.flows.bundle`), so a bundle found in
the cache needs them but none of the machinery that writes a config (tests/bundler/
test_cli_imports.py keeps that machinery out of a warm bundle).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from ocistage.runtimes.idmap import RootPlaceholder, detect_root_placeholder


@dataclass(frozen=True)
class ConfigOptions:
    """Caller's overrides of the image config ("externally provided inputs" in conversion.md)."""

    rootless: bool = True
    args: Sequence[str] | None = None  # --cmd: replaces Cmd, keeps Entrypoint
    entrypoint: Sequence[str] | None = None  # --entrypoint: replaces Entrypoint, clears Cmd
    env: Sequence[str] = ()  # --env NAME=value, added or overriding
    mounts: Sequence[str] = ()  # --mount SRC:DST[:ro|:rw]
    readonly: bool = False
    hostname: str | None = None
    gpus: str | None = None  # None | "all" | "0,1" (indices or GPU UUIDs)
    map_root: bool = False  # rootless: run as container root (runc 1.1 needs uid 0 mapped)
    #: rootless: run as the caller's own uid/gid inside (an identity mapping): what Slurm's
    #: PMIx server accepts from an MPI rank (runtimes/pmix_ids.py); crun or runc >= 1.2
    map_self: bool = False
    host_uid: int = field(default_factory=os.getuid)
    host_gid: int = field(default_factory=os.getgid)
    # host ids for container 0 when the image user is not root (runc 1.1 needs 0 mapped)
    root_placeholder: RootPlaceholder | None = field(default_factory=detect_root_placeholder)
    terminal: bool = False
