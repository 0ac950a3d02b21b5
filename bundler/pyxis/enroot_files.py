"""The files ``enroot import`` writes into a rootfs, made from an image's config, and the
values this refuses to write there.

enroot 4.1.2 (``docker::configure`` in src/docker.sh) writes, from the image config:

- ``/etc/fstab``: a line ``${ENROOT_ROOTFS}PATH PATH none x-create=dir,bind,rw,nosuid,nodev``
  per Volume; at start enroot substitutes ``${NAME}`` from its environment and mounts each
  line (getmntent: fields split at blanks, ``\\NNN`` escapes decoded), the source outside the
  container, as a bind mount;
- ``/etc/environment``: a line per Env entry (``${NAME}`` substituted at start too);
- ``/etc/rc``: a comment per label (``# KEY VALUE``, the value's newlines made spaces), then
  the script bash runs: ``mkdir -p "WORKDIR"``, ``cd "WORKDIR"``, source ``/etc/rc.local``,
  ``exec`` the Entrypoint with the arguments, or with Cmd (``${word@Q}``-quoted words);
- an empty ``/etc/rc.local``.

enroot writes every value raw, so an image chooses the structure of these files: a label key
or Env entry with a newline adds a line to ``/etc/rc`` or ``environment``; a Volume with a
blank, a newline, ``..``, ``$`` or no leading ``/`` bind-mounts a host path into the container
(rw); a WorkingDir with ``"``, ``$``, a backquote or a backslash runs a command in ``/etc/rc``.
Here such a value is refused (:class:`~ocistage.bundler.errors.PyxisImportError` naming the
image and the field, docs/pyxis.md), as is what cannot be written at all (NUL, lone
surrogates) and a leading ``-`` where a word would become an option of ``mkdir``, ``cd`` or
``exec``. A well-formed image gets the same bytes as from enroot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ocistage.bundler.errors import PyxisImportError

#: characters that end or open something inside ``"..."`` in bash (the WorkingDir lines)
_DOUBLE_QUOTE_SPECIAL = frozenset('"$`\\\n')
#: what a Volume path may not hold: getmntent's field separators and escapes, enroot's
#: ``${NAME}`` substitution
_VOLUME_SPECIAL = frozenset("\\$")
RC_LOCAL = ("# This file is sourced by /etc/rc when the container starts.\n"
            "# It can be used to manipulate the entrypoint or the command of the container.\n")


class _Refuse:
    """Raises the refusal of one value of image ``image``."""

    def __init__(self, image: str) -> None:
        self.image = image

    def __call__(self, field: str, value: str, why: str) -> PyxisImportError:
        shown = value if len(value) <= 60 else value[:60] + "..."
        return PyxisImportError(
            f"image {self.image}: {field} {shown!r} {why}",
            "enroot would write it raw into the container's /etc (fstab, environment or rc), "
            "where it changes what those files say; ocistage refuses it (docs/pyxis.md): "
            "fix the image's config")

    def writable(self, field: str, value: str) -> str:
        """``value``, if it can be written into a file at all (no NUL, encodable)."""
        if "\x00" in value:
            raise self(field, value, "holds a NUL character")
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise self(field, value, "is not valid Unicode (a lone surrogate)") from exc
        return value


def _bash_quote(word: str) -> str:
    """``${word@Q}`` as bash writes it: single quotes, or ``$'...'`` with escapes when the word
    holds control characters."""
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in word):
        escapes = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}
        inner = "".join(escapes.get(c, f"\\{ord(c):03o}" if ord(c) < 0x20 or ord(c) == 0x7f
                                    else c) for c in word)
        return f"$'{inner}'"
    return "'" + word.replace("'", "'\\''") + "'"


def _jq_raw(value: object) -> str:
    """A value as ``jq -r`` prints it: strings raw, anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _strings(value: object) -> list[str]:
    if not isinstance(value, list):
        return []
    return [_jq_raw(item) for item in value if item is not None]


def _fstab(volumes: list[str], refuse: _Refuse) -> str:
    for path in volumes:
        field = "config.Volumes path"
        refuse.writable(field, path)
        if not path.startswith("/"):
            raise refuse(field, path, "is not absolute: its bind mount's source would be "
                         "outside the container's rootfs")
        if ".." in path.split("/"):
            raise refuse(field, path, "has a '..' component: its bind mount's source would "
                         "be outside the container's rootfs")
        bad = next((c for c in path if c.isspace() or ord(c) < 0x20 or ord(c) == 0x7f
                    or c in _VOLUME_SPECIAL), None)
        if bad is not None:
            raise refuse(field, path, f"holds {bad!r}, which splits or rewrites its line in "
                         "/etc/fstab")
    return "".join(f"${{ENROOT_ROOTFS}}{path} {path} none x-create=dir,bind,rw,nosuid,nodev\n"
                   for path in volumes)


def _environment(env: list[str], refuse: _Refuse) -> str:
    for n, entry in enumerate(env):
        if "\n" in refuse.writable(f"config.Env[{n}]", entry):
            raise refuse(f"config.Env[{n}]", entry, "holds a newline, which adds a line to "
                         "/etc/environment")
    return "".join(f"{entry}\n" for entry in env)


def _label_comments(labels: Mapping[str, object], refuse: _Refuse) -> str:
    lines = []
    for key, value in labels.items():
        if "\n" in refuse.writable("config.Labels key", key):
            raise refuse("config.Labels key", key, "holds a newline, which adds a line to "
                         "/etc/rc")
        field = f"config.Labels[{key[:40]!r}{'...' if len(key) > 40 else ''}]"
        text = refuse.writable(field, _jq_raw(value)).replace("\n", " ")
        lines.append(f"# {key} {text}\n")
    return "".join(lines) + ("\n" if lines else "")


def _workdir(value: object, refuse: _Refuse) -> str:
    workdir = value if isinstance(value, str) and value else "/"
    refuse.writable("config.WorkingDir", workdir)
    bad = next((c for c in workdir if c in _DOUBLE_QUOTE_SPECIAL), None)
    if bad is not None:
        raise refuse("config.WorkingDir", workdir, f"holds {bad!r}, which ends or expands "
                     "the double-quoted word it is in /etc/rc")
    if workdir.startswith("-"):
        raise refuse("config.WorkingDir", workdir, "starts with '-': an option of mkdir "
                     "and cd in /etc/rc")
    return workdir


def _command(config: Mapping[str, Any], refuse: _Refuse) -> tuple[list[str], list[str]]:
    entrypoint = _strings(config.get("Entrypoint"))
    cmd = _strings(config.get("Cmd"))
    if not entrypoint and not cmd:
        cmd = ["/bin/sh"]
    for name, words in (("Entrypoint", entrypoint), ("Cmd", cmd)):
        for n, word in enumerate(words):
            refuse.writable(f"config.{name}[{n}]", word)
    first = ("Entrypoint", entrypoint) if entrypoint else ("Cmd", cmd)
    if first[1][0].startswith("-"):
        raise refuse(f"config.{first[0]}[0]", first[1][0], "starts with '-': an option of "
                     "exec in /etc/rc, not the program to run")
    return entrypoint, cmd


def enroot_files(image_config: Mapping[str, Any], image: str = "the image"
                 ) -> tuple[dict[str, bytes], str]:
    """The files ``enroot import`` writes into a rootfs, by path inside it, and the working
    directory it creates there (see the module docstring); enroot uses no other field of the
    config (not User). A value that would change the structure of these files is refused
    with a :class:`~ocistage.bundler.errors.PyxisImportError` naming ``image`` and the field.
    """
    refuse = _Refuse(image)
    config = image_config.get("config")
    config = config if isinstance(config, dict) else {}
    volumes = config.get("Volumes")
    fstab = _fstab(sorted(volumes if isinstance(volumes, dict) else {}), refuse)
    environment = _environment(_strings(config.get("Env")), refuse)
    labels = config.get("Labels")
    rc = _label_comments(labels if isinstance(labels, dict) else {}, refuse)
    workdir = _workdir(config.get("WorkingDir"), refuse)
    entrypoint, cmd = _command(config, refuse)
    quoted_entry = " ".join(_bash_quote(w) for w in entrypoint)
    quoted_cmd = " ".join(_bash_quote(w) for w in cmd)
    rc += (f'mkdir -p "{workdir}" 2> /dev/null\n'
           f'cd "{workdir}" && unset OLDPWD || exit 1\n'
           "\n"
           "if [ -s /etc/rc.local ]; then\n"
           "    . /etc/rc.local\n"
           "fi\n"
           "\n"
           "if [ $# -gt 0 ]; then\n"
           f'    exec {quoted_entry} "$@"\n'
           "else\n"
           f"    exec {quoted_entry} {quoted_cmd}\n"
           "fi\n")
    files = {"etc/fstab": fstab, "etc/environment": environment, "etc/rc": rc,
             "etc/rc.local": RC_LOCAL}
    return {path: text.encode() for path, text in files.items()}, workdir
