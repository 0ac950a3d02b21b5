"""The errors of the ``stagers`` package, in the one hierarchy rooted in
:mod:`ocistage.errors`."""

from __future__ import annotations

from ocistage.errors import OcistageError, UsageError


class StageError(OcistageError):
    """Staging or unstaging failed (source unreadable, target not writable, unsafe path)."""

    default_hint = "check that the source is readable and the target directory is writable"


class StageUsageError(StageError, UsageError):
    """A stage command line that cannot be right (no such source directory, a target that is
    a file, a name that is no plain file name): exit 2, as any usage error."""


class PseudoNameError(StageError):
    """A name that no mksquashfs pseudo definition can carry (a NUL byte, a character with no
    byte form, a component longer than a squashfs name may be): refused, never passed on."""

    default_hint = "rename it in the image or bundle: a squashfs image cannot hold that name"


class ToolFailed(StageError):
    """mksquashfs or unsquashfs failed (:func:`ocistage.stagers.mksquashfs.run_tool`): the
    message ends with the last line it printed (or its exit status); ``said`` holds its last
    lines, ``status`` its exit status (None: it could not be started or ran out of time)."""

    def __init__(self, message: str, said: tuple[str, ...] = (), status: int | None = None,
                 hint: str | None = None, *, no_space: bool = False, detail: str = "") -> None:
        super().__init__(message, hint)
        self.said = said
        self.status = status
        self.no_space = no_space  # it ran out of space where it writes
        self.detail = detail  # the line of its output that says what went wrong
