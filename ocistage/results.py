"""What a library call hands the command line renders itself, the same way for every command.

A result has one JSON form, :meth:`Result.to_json` (snake_case keys, JSON values; what
``--json`` prints, docs/cli.md lists the keys), and one human form, :meth:`Result.render`,
which says what there is to say to a :class:`Renderer`. The command line implements the
renderer (``ocistage.bundler.cli.common``): it decides how a line looks (rich or plain, control
characters written out, markup escaped) and what ``--quiet`` leaves out; the result decides
what is said. The protocols live here, at the bottom of the layers, so that results of every
package (the cache's reports too) can implement them without importing anything above.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any, Protocol

#: a result's JSON document: an object, or a list of objects (``stage --all-nodes``)
JsonDoc = dict[str, Any] | list[dict[str, Any]]


class Renderer(Protocol):
    """Where a result's human form goes. Texts are plain: the renderer makes them safe."""

    def line(self, text: str = "", *, faint: str = "") -> None:
        """A line of the result on stdout (a digest, a path, a field), ``faint`` after it."""

    def detail(self, text: str) -> None:
        """A line on stdout that ``--quiet`` leaves out."""

    def heading(self, text: str) -> None:
        """A line on stdout that stands out (an image's name above its fields)."""

    def note(self, text: str) -> None:
        """A summary line on stderr (what was done); ``--quiet`` leaves it out."""

    def warning(self, text: str) -> None:
        """``warning: text`` on stderr, also with ``--quiet``."""

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[str]], *,
              title: str | None = None, right: Collection[str] = (),
              names_last: bool = True) -> None:
        """A table on stdout; the columns named in ``right`` are right-aligned. With
        ``names_last`` the last column holds names or paths: it folds, the others never
        wrap."""


class JsonResult(Protocol):
    """A result that only has a JSON form (a line for a script: ``scrun stage-in``)."""

    def to_json(self) -> JsonDoc:
        """The result as ``--json`` prints it: snake_case keys, JSON values."""


class Result(JsonResult, Protocol):
    """A result of a command: its JSON form and its human form."""

    def render(self, out: Renderer) -> None:
        """Say the result to ``out``: the lines a person reads."""
