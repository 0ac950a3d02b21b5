"""Renders the ``scrun.lua`` that ``ocistage runtime scrun-lua`` prints for site admins.

The Lua program is the package data file ``scrun.lua.in`` beside this module, read with
:mod:`importlib.resources`. Its markers (``@OCISTAGE@``, ``@STAGE_DIR@``, ...) are replaced in
one pass, each by a Lua string literal that :func:`lua_string` alone makes (or by ``nil``, or
by one of two fixed lines for ``@JSON@``): no value from a user is ever Lua text.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

from ocistage.errors import UsageError
from ocistage.runtimes.slurm import SlurmVersion

StageTo = Literal["shared", "node-local"]
TEMPLATE_NAME = "scrun.lua.in"


@dataclass(frozen=True)
class ScrunLuaOptions:
    ocistage: Sequence[str] = ("ocistage",)   # argv prefix that runs ocistage on the nodes
    stage_to: StageTo = "shared"
    stage_dir: str = "/tmp/ocistage-scrun"
    cache: str | None = None                  # None: each user's default cache
    sbatch: str | None = None                 # queues each bundle's cleanup job; None: none
    slurm_json: bool = False                  # Slurm >= 26.05: slurm.from_json, no lua-cjson


def lua_string(text: str) -> str:
    """``text`` as a Lua string literal (every byte outside printable ASCII escaped).

    Lua strings are bytes: a non-UTF-8 name (a ``surrogateescape`` str, as Python decodes
    argv) is written as the bytes it stands for; a string that stands for no bytes at all (a
    lone surrogate of no such escape) is refused.
    """
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{text!r} is not text that stands for bytes",
                         "pass the value as the bytes it is (a path, a command)") from exc
    out = []
    for byte in data:
        char = chr(byte)
        if char in '"\\' or byte < 0x20 or byte >= 0x7F:
            out.append(f"\\{byte:03d}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


@cache
def lua_template() -> str:
    """The Lua program with its markers (the package data file :data:`TEMPLATE_NAME`)."""
    return resources.files("ocistage.runtimes").joinpath(TEMPLATE_NAME).read_text("utf-8")


#: Slurm 26.05's Lua has slurm.from_json/slurm.to_json (src/lua/slurm_lua.c): no lua-cjson
SLURM_JSON = "local json = {decode = slurm.from_json, encode = slurm.to_json}"
SLURM_JSON_SINCE = SlurmVersion(26, 5)


def hook_ocistage(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The argv prefix that runs this ocistage from scrun's hooks, absolute: this interpreter
    with ``-P -m ocistage`` (:func:`ocistage.runtimes.submit.this_ocistage`).

    The hooks run with the environment scrun got from the engine (Podman's conmon passes
    ``PATH=/usr/local/sbin:...:/bin`` and little else), so nothing may depend on the caller's
    ``PATH`` or ``PYTHONPATH``: when this ocistage was imported through ``PYTHONPATH`` (a
    checkout), ``env PYTHONPATH=<that directory>`` comes first.
    """
    from ocistage.runtimes.submit import this_ocistage

    command = tuple(this_ocistage())
    if not os.path.isabs(command[0]):
        raise UsageError(f"this Python's path {command[0]!r} is not absolute",
                         "pass --ocistage PATH (the ocistage command on the nodes)")
    env = os.environ if environ is None else environ
    root = Path(sys.modules["ocistage"].__file__ or "/").parent.parent
    entries = [Path(entry).absolute() for entry in env.get("PYTHONPATH", "").split(":")
               if entry]
    if root.absolute() in entries:
        return ("/usr/bin/env", f"PYTHONPATH={root.absolute()}", *command)
    return command


#: scrun.lua's STAGE_DIR unless the admin names one, by --stage-to: a node-local one outside
#: /tmp and /dev/shm, which Slurm 25.11's NamespaceType=namespace/tmpfs makes private to each
#: job (the next job would not see what stage-in staged); /tmp for shared, where the admin is
#: expected to name a directory every node sees
DEFAULT_STAGE_DIRS = {"shared": "/tmp/ocistage-scrun", "node-local": "/var/tmp/ocistage-scrun"}


def default_stage_dir(stage_to: str) -> str:
    """:data:`DEFAULT_STAGE_DIRS` of ``stage_to``."""
    return DEFAULT_STAGE_DIRS.get(stage_to, DEFAULT_STAGE_DIRS["shared"])


def scrun_lua_options(*, ocistage: str | None, stage_to: str, stage_dir: str,
                      cache: str | None, sbatch: str | None, find_sbatch: bool,
                      version: SlurmVersion | None = None) -> ScrunLuaOptions:
    """Options from what a user typed; ``ocistage`` None: :func:`hook_ocistage`;
    ``find_sbatch``: take the sbatch on PATH when ``sbatch`` is not given (scrun runs the
    hooks with the engine's PATH, so absolute paths are written)."""
    if stage_to not in ("shared", "node-local"):
        raise UsageError(f"unknown --stage-to {stage_to!r}", "choose shared or node-local")
    if ocistage is not None and not ocistage.startswith("/"):
        raise UsageError(f"--ocistage must be an absolute path, not {ocistage!r}",
                         "scrun runs the hooks with the engine's PATH (Podman's conmon: "
                         "/usr/local/sbin:...:/bin), not yours")
    if sbatch is None and find_sbatch:
        found = shutil.which("sbatch")
        if found is None:
            raise UsageError("sbatch not found on PATH: it queues each staged bundle's "
                             "cleanup job", "pass --sbatch PATH, or --no-cleanup-job")
        sbatch = os.path.abspath(found)
    return ScrunLuaOptions(ocistage=(ocistage,) if ocistage else hook_ocistage(),
                           stage_to="shared" if stage_to == "shared" else "node-local",
                           stage_dir=stage_dir, cache=cache, sbatch=sbatch,
                           slurm_json=version is not None and version >= SLURM_JSON_SINCE)


def render_scrun_lua(options: ScrunLuaOptions) -> str:
    """scrun.lua for ``options``: the template with each value one Lua string literal
    (:func:`lua_string`), never raw text."""
    if options.stage_to not in ("shared", "node-local"):
        raise UsageError(f"unknown stage target kind {options.stage_to!r}",
                         "choose shared or node-local")
    if not options.stage_dir.startswith("/"):
        raise UsageError(f"--stage-dir must be absolute, not {options.stage_dir!r}",
                         "the hooks run on other hosts, in other directories")
    if not options.ocistage:
        raise UsageError("the ocistage command is empty",
                         "pass --ocistage PATH (the ocistage command on the nodes)")
    if options.sbatch is not None and not options.sbatch.startswith("/"):
        raise UsageError(f"--sbatch must be an absolute path, not {options.sbatch!r}",
                         "scrun runs the hooks without a PATH")
    replacements = {
        "@OCISTAGE@": ", ".join(lua_string(word) for word in options.ocistage),
        "@STAGE_TO@": lua_string(options.stage_to),
        "@STAGE_DIR@": lua_string(options.stage_dir),
        "@CACHE@": lua_string(options.cache) if options.cache else "nil",
        "@SBATCH@": lua_string(options.sbatch) if options.sbatch else "nil",
        "@JSON@": SLURM_JSON if options.slurm_json else 'local json = require("cjson")',
    }
    # one pass: a value holding another marker (a path with @CACHE@ in it) stays a value
    return _MARKER.sub(lambda match: replacements[match.group(0)], lua_template())


_MARKER = re.compile(r"@(?:OCISTAGE|STAGE_TO|STAGE_DIR|CACHE|SBATCH|JSON)@")
