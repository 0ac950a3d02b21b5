"""Errors of the hand-off to Slurm and OCI runtimes: Slurm's commands, the scrun stage
hooks, and the image user looked up in a rootfs."""

from __future__ import annotations

from ocistage.errors import OcistageError


class SlurmError(OcistageError):
    """A Slurm command is missing, failed, or printed something we cannot read."""

    default_hint = ("check that Slurm's client commands are installed and that `sinfo` "
                    "reaches the controller")


class ScrunError(OcistageError):
    """A stage hook cannot do its work (unreadable bundle, not a bundle we staged)."""


class UserResolutionError(OcistageError):
    default_hint = (
        "the image's User does not exist in its /etc/passwd or /etc/group; "
        "override it with a numeric uid[:gid]"
    )
