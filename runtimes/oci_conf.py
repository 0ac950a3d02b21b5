"""Slurm ``oci.conf``: templates per OCI runtime and Slurm version, and a linter.

slurmstepd reads ``oci.conf`` on the node that runs a ``--container`` step and calls the
runtime through the ``RunTime*`` command patterns (run with ``/bin/sh -c`` as the job user).
A token it does not know (``%x``) is fatal to slurmstepd, and Slurm 22.05 (Debian 12) knows
fewer keys and tokens than later releases, so both the template and the linter depend on the
Slurm version.

Only run mode (``RunTimeRun``) is generated. Create/start mode cannot work with slurmstepd
(22.05 through 24.05.8, ``container.c`` ``_create_start``): it reads ``RunTimeCreate``'s output
until EOF, and ``runc create`` / ``crun create`` leave the container's init holding that pipe
(the step hangs until its time limit and the node drains); and the task exits with
``RunTimeStart``'s status, never the container's. The linter flags such a configuration.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ocistage.errors import UsageError
from ocistage.runtimes.runtime_state import root_problems, spool_root
from ocistage.runtimes.slurm import SlurmVersion

RUNTIMES = ("runc", "crun", "nvidia-container-runtime", "apptainer", "enroot")
#: short names accepted for a runtime
_ALIASES = {"nvidia": "nvidia-container-runtime"}
#: why create/start mode is neither generated nor accepted by the linter
CREATE_MODE_PROBLEM = (
    "create/start mode does not work with slurmstepd: it reads RunTimeCreate's output until "
    "EOF, which runc/crun create never close (the step hangs and the node drains), and the "
    "task exits with RunTimeStart's status instead of the container's"
)
CREATE_MODE_HINT = "use run mode (RunTimeRun, the default of `ocistage runtime oci-conf`)"

#: keys slurmstepd 22.05 accepts (src/slurmd/slurmstepd/read_oci_conf.c), then the set 23.02
#: moved to src/common/oci_config.c, unchanged through 26.05 (checked in SchedMD's tags
#: slurm-22-05-11-1, 23-02-1-1, 23-11-1-1, 24-05-8-1, 24-11-1-1, 25-05-1-1, 25-11-1-1, 26-05-3-1)
_KEYS_22_05 = frozenset({
    "ContainerPath", "CreateEnvFile", "RunTimeCreate", "RunTimeDelete", "RunTimeKill",
    "RunTimeQuery", "RunTimeRun", "RunTimeStart",
})
_KEYS_23_02 = _KEYS_22_05 | {
    "DisableCleanup", "DisableHooks", "EnvExclude", "IgnoreFileConfigJson", "MountSpoolDir",
    "RunTimeEnvExclude", "SrunPath", "SrunArgs", "DebugFlags", "FileDebug", "StdIODebug",
    "SyslogDebug",
}
#: keys Slurm parses as a list (``S_P_ARRAY``): each line adds one item
_LIST_KEYS = frozenset({"SrunArgs"})
#: pattern tokens (the character after %) that slurmstepd's _generate_pattern() expands, by
#: the first release that knows them; any other character is fatal ("unexpected replacement
#: character"). Same tags as the keys: 22.05, +mpU in 23.02 (through 25.11), +Z in 26.05.
_TOKENS_22_05 = frozenset("%@bejnrstu")
_TOKENS_23_02 = _TOKENS_22_05 | frozenset("mpU")
_TOKENS_26_05 = _TOKENS_23_02 | frozenset("Z")
#: %p (the container's pid) only means something where a container runs already
_PID_KEYS = frozenset({"RunTimeKill", "RunTimeDelete"})
_PATTERN_KEYS = frozenset({"ContainerPath", "MountSpoolDir", "RunTimeCreate", "RunTimeDelete",
                           "RunTimeKill", "RunTimeQuery", "RunTimeRun", "RunTimeStart"})
CONTAINER_ID = "%n.%u.%j.%s.%t"
#: what RunTimeQuery prints once the container is gone. slurmstepd queries the state after
#: the container exited (to decide on RunTimeKill/RunTimeDelete) and parses the output as
#: JSON: runc's logfmt error (``time=... level=error msg="container does not exist"``) gave
#: 22.05-24.05's ``_try_parse: JSON parsing error ... boolean expected`` in every job's
#: output, and a non-zero status is ``RunTimeQuery failed`` on 26.05 (container.c
#: ``_get_container_state``). "stopped" leads to RunTimeDelete, which is harmless then.
#: Written for printf with octal quotes: a quoted oci.conf value cannot hold a double quote,
#: and Slurm's parser turns each ``\\`` into one backslash (parse_config.c _strip_escapes).
STOPPED_STATE = r"printf '{\\042status\\042:\\042stopped\\042}'"
_MAX_OCI_CONF = 1024 * 1024
DEBIAN_12_SLURM = SlurmVersion(22, 5)


def known_keys(version: SlurmVersion) -> frozenset[str]:
    return _KEYS_22_05 if version < SlurmVersion(23, 2) else frozenset(_KEYS_23_02)


def known_tokens(version: SlurmVersion) -> frozenset[str]:
    if version < SlurmVersion(23, 2):
        return _TOKENS_22_05
    return _TOKENS_23_02 if version < SlurmVersion(26, 5) else _TOKENS_26_05


def default_root(runtime: str, version: SlurmVersion) -> str:
    """The runtime's state directory: the step's own spool directory, which slurmstepd makes
    for each step and job user (:mod:`ocistage.runtimes.runtime_state`): ``%m`` from 23.02,
    ``%b`` on 22.05 (which has no ``%m`` and always runs the bundle it writes there). Not
    ``/run/user/UID``: systemd-logind makes it only for users with a login session on the
    node, which job users usually lack. ``runtime`` is not part of it: one step, one runtime.
    """
    del runtime
    return spool_root(version)


@dataclass(frozen=True)
class OciConfOptions:
    runtime: str = "runc"
    root: str | None = None         # None: default_root(runtime, version)
    version: SlurmVersion = DEBIAN_12_SLURM
    srun_path: str | None = None    # SrunPath (>= 23.02): scrun runs srun without a PATH


def oci_conf_options(runtime: str, mode: str, root: str | None,
                     version: SlurmVersion) -> OciConfOptions:
    """Options from what a user typed: ``nvidia`` for its runtime, ``srun`` from ``PATH``.

    Raises :class:`UsageError` for an unknown runtime or mode, and for create mode, which
    slurmstepd cannot run (:data:`CREATE_MODE_PROBLEM`).
    """
    name = _ALIASES.get(runtime, runtime)
    if name not in RUNTIMES:
        raise UsageError(f"unknown runtime {runtime!r}", f"choose one of {', '.join(RUNTIMES)}")
    if mode == "create":
        raise UsageError(CREATE_MODE_PROBLEM, CREATE_MODE_HINT)
    if mode != "run":
        raise UsageError(f"unknown mode {mode!r}", "the one mode is run")
    srun = shutil.which("srun")  # scrun reads SrunPath from oci.conf: it runs srun without PATH
    return OciConfOptions(runtime=name, root=root, version=version,
                          srun_path=os.path.abspath(srun) if srun else None)


def lint_oci_conf_file(path: Path, version: SlurmVersion) -> list[Problem]:
    """:func:`lint_oci_conf` of the file at ``path`` (small: oci.conf is a few lines)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_OCI_CONF + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    if len(data) > _MAX_OCI_CONF:
        raise UsageError(f"{path} is larger than {_MAX_OCI_CONF // 1024} KiB",
                         "is it an oci.conf?")
    return lint_oci_conf(data.decode("utf-8", errors="replace"), version)


#: what a path in an oci.conf value may hold: Slurm's parser ends the value at a ``"``, cuts the
#: line at a ``#`` (quoted or not) and drops a backslash; slurmstepd then runs the expanded pattern
#: with ``/bin/sh -c``, so no whitespace, quote or shell syntax either (docs/trust.md)
_PLAIN_ASCII = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                         "0123456789_./+,:@=-")
#: the pattern tokens a runtime root may use: names and numbers of the job, never a path or
#: arguments slurmstepd puts in unquoted (%b %r %e %m) or quoted (%@), never the pid (%p)
_ROOT_TOKENS = frozenset("%jnstuUZ")


def _plain_path(path: str, what: str, tokens: frozenset[str] = frozenset()) -> str:
    """``path`` if an oci.conf value and the shell after it carry it as one word (absolute,
    printable, no whitespace, quote, ``#``, backslash or shell syntax; ``%`` only before one of
    ``tokens``); else :class:`UsageError`."""
    hint = "choose a plain absolute path (letters, digits, _./+,:@=-" + \
        (", Slurm patterns like %u)" if tokens else ")")
    if not path.startswith("/"):
        raise UsageError(f"{what} {path!r} is not an absolute path", hint)
    index = 0
    while index < len(path):
        char = path[index]
        if char == "%" and path[index + 1:index + 2] in tokens:
            index += 2
            continue
        if char == "%":
            raise UsageError(f"{what} {path!r}: %{path[index + 1:index + 2]} is no pattern "
                             "token slurmstepd expands there", hint)
        if not (char in _PLAIN_ASCII or (not char.isascii() and char.isprintable()
                                          and not char.isspace())):
            raise UsageError(f"{what} {path!r} contains spaces, quotes, '#', control "
                             "characters or shell syntax", hint)
        index += 1
    return path


def _query(command: str) -> str:
    """``command`` (a runtime's ``state``), or the stopped state once the container is gone:
    slurmstepd runs the pattern with ``/bin/sh -c`` on every release (container.c)."""
    return f"{command} 2>/dev/null || {STOPPED_STATE}"


def _commands(options: OciConfOptions) -> dict[str, str]:
    runtime = options.runtime
    cid = CONTAINER_ID
    root = (_plain_path(options.root, "runtime root",
                        _ROOT_TOKENS & known_tokens(options.version))
            if options.root else default_root(runtime, options.version))
    if runtime in ("runc", "crun", "nvidia-container-runtime"):
        base = f"{runtime} --rootless=true --root={root}"
        bundle = "--bundle %b" if runtime == "crun" else "-b %b"
        commands = {
            "RunTimeQuery": _query(f"{base} state {cid}"),
            "RunTimeKill": f"{base} kill -a {cid}" if runtime != "crun" else
                           f"{base} kill --all {cid}",
            "RunTimeDelete": f"{base} delete --force {cid}",
        }
        commands["RunTimeRun"] = (f"{base} run {bundle} {cid}" if runtime == "crun"
                                  else f"{base} run {cid} {bundle}")
        return commands
    if runtime == "apptainer":
        commands = {
            "RunTimeQuery": _query(f"apptainer oci state {cid}"),
            "RunTimeKill": f"apptainer oci kill {cid}",
            "RunTimeDelete": f"apptainer oci delete {cid}",
        }
        commands["RunTimeRun"] = f"apptainer oci run --bundle %b {cid}"
        return commands
    if runtime == "enroot":
        # enroot keeps containers as directories named after them under ENROOT_DATA_PATH:
        # the bundle's rootfs/ is such a container. The runtime process is slurmstepd's child,
        # so the step is signalled and reaped by Slurm itself; there is no state to query
        # (an empty answer is "RunTimeQuery failed" on 26.05).
        return {
            "RunTimeQuery": STOPPED_STATE,
            "RunTimeKill": "true",
            "RunTimeDelete": "true",
            "RunTimeRun": "env ENROOT_DATA_PATH=%b enroot start --rw rootfs %@",
        }
    raise UsageError(f"unknown runtime {runtime!r}", f"choose one of {', '.join(RUNTIMES)}")


_NOTES = {
    "runc": "runc 1.1 needs container uid 0 mapped: ocistage bundles map it (see "
            "docs/runtime-config.md).",
    "crun": "crun < 1.9 refuses hosts with cgroup v1 controllers plus a cgroup2 hierarchy "
            "(hybrid mode).",
    "nvidia-container-runtime": "set no-cgroups = true in "
                                "/etc/nvidia-container-runtime/config.toml for rootless use.",
    "apptainer": "apptainer >= 1.1 runs OCI bundles without root (`apptainer oci`).",
    "enroot": "enroot ignores config.json (env, cwd, user, mounts): prefer runc or crun.",
}


def render_oci_conf(options: OciConfOptions) -> str:
    """The text of an ``oci.conf`` for ``options`` (lint-clean for ``options.version``)."""
    commands = _commands(options)
    lines = [
        f"# oci.conf for {options.runtime} (run mode), Slurm {options.version}",
        "# generated by `ocistage runtime oci-conf`; check with `ocistage runtime oci-conf "
        "--check FILE`",
        f"# note: {_NOTES[options.runtime]}",
    ]
    order = ("RunTimeQuery", "RunTimeCreate", "RunTimeStart", "RunTimeRun", "RunTimeKill",
             "RunTimeDelete")
    lines += [f'{key}="{commands[key]}"' for key in order if key in commands]
    if options.version >= SlurmVersion(23, 2):
        # never hand the login node's secrets or session to the container's runtime
        lines.append('RunTimeEnvExclude="^(SLURM_CONF|SLURM_CONF_SERVER)="')
        if options.srun_path is not None:
            lines.append(f'SrunPath="{_plain_path(options.srun_path, "srun path")}"')
    return "\n".join(lines) + "\n"


# -- lint --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    line: int          # 0: the file as a whole
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


def parse_oci_conf(text: str) -> tuple[dict[str, tuple[int, str]], list[Problem]]:
    """``Key=Value`` lines -> {canonical key or as written: (line number, value)}, problems.

    Keys are case-insensitive (as Slurm's parser); ``#`` starts a comment, inside quotes too
    (:func:`_strip_comment`); values may be double-quoted. A list key (``SrunArgs``) may
    repeat; its entry is the last line (every line is one more item for Slurm).
    """
    canonical = {key.lower(): key for key in _KEYS_23_02}
    entries: dict[str, tuple[int, str]] = {}
    problems: list[Problem] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw).strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(Problem(number, f"not a Key=Value line: {raw.strip()!r}"))
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        elif value.startswith('"'):
            problems.append(Problem(number, f"{key}: unterminated quote"))
        name = canonical.get(key.lower(), key)
        if name in entries and name not in _LIST_KEYS:
            problems.append(Problem(number, f"{name} is set again (first on line "
                                            f"{entries[name][0]})"))
        entries[name] = (number, value)
    return entries, problems


def _strip_comment(line: str) -> str:
    """``line`` up to its comment, as Slurm cuts it (parse_config.c ``_strip_comments``): at
    the first ``#`` after an even number of backslashes, inside quotes too."""
    backslashes = 0
    for index, char in enumerate(line):
        if char == "#" and backslashes % 2 == 0:
            return line[:index]
        backslashes = backslashes + 1 if char == "\\" else 0
    return line


def _token_problems(key: str, number: int, value: str,
                    tokens: frozenset[str], version: SlurmVersion) -> list[Problem]:
    problems = []
    for match in re.finditer(r"%(.?)", value):
        token = match.group(1)
        if match.start() > 0 and _escaped(value, match.start()):
            continue
        if token == "":
            problems.append(Problem(number, f"{key}: a lone % at the end of the pattern"))
        elif token not in tokens:
            problems.append(Problem(number, f"{key}: unknown pattern token %{token} for "
                                            f"Slurm {version} (fatal to slurmstepd)"))
        elif token == "p" and key not in _PID_KEYS:
            problems.append(Problem(number, f"{key}: %p is only known in RunTimeKill and "
                                            "RunTimeDelete"))
    return problems


def _escaped(value: str, index: int) -> bool:
    """Whether the % at ``index`` is the second half of a ``%%``."""
    count = 0
    while index > 0 and value[index - 1] == "%":
        count += 1
        index -= 1
    return count % 2 == 1


def lint_oci_conf(text: str, version: SlurmVersion) -> list[Problem]:
    """Every problem slurmstepd of ``version`` would have with this ``oci.conf``."""
    entries, problems = parse_oci_conf(text)
    problems.extend(_key_problems(entries, version))
    problems.extend(_runtime_problems(entries))
    problems.extend(_value_problems(entries, version))
    problems.extend(_release_problems(entries, version))
    problems.extend(Problem(line, message) for line, message in root_problems(entries))
    return sorted(problems, key=lambda p: (p.line, p.message))


def _key_problems(entries: dict[str, tuple[int, str]],
                  version: SlurmVersion) -> list[Problem]:
    """Keys ``version`` does not know, and pattern tokens it does not know."""
    problems = []
    keys, tokens = known_keys(version), known_tokens(version)
    for name, (number, value) in entries.items():
        if name not in keys:
            later = " (added in Slurm 23.02)" if name in _KEYS_23_02 else ""
            problems.append(Problem(number, f"unknown key {name} for Slurm {version}{later}"))
            continue
        if name in _PATTERN_KEYS:
            problems.extend(_token_problems(name, number, value, tokens, version))
    return problems


def _runtime_problems(entries: dict[str, tuple[int, str]]) -> list[Problem]:
    """The runtime commands slurmstepd needs: query, kill and delete, and either
    ``RunTimeRun`` or both ``RunTimeCreate`` and ``RunTimeStart`` (create mode is flagged)."""
    problems = []
    has = {name for name, (_, value) in entries.items() if value}
    for required in ("RunTimeQuery", "RunTimeKill", "RunTimeDelete"):
        if required not in has:
            problems.append(Problem(0, f"missing required key {required}"))
    if "RunTimeRun" in has:
        if has & {"RunTimeCreate", "RunTimeStart"}:
            problems.append(Problem(entries["RunTimeRun"][0],
                                    "RunTimeRun excludes RunTimeCreate/RunTimeStart"))
        return problems
    if not has & {"RunTimeCreate", "RunTimeStart"}:
        problems.append(Problem(0, "missing RunTimeRun"))
    for key, other in (("RunTimeCreate", "RunTimeStart"), ("RunTimeStart", "RunTimeCreate")):
        if key in has and other not in has:
            problems.append(Problem(entries[key][0], f"{key} needs {other}"))
    if "RunTimeCreate" in has:
        problems.append(Problem(entries["RunTimeCreate"][0],
                                f"{CREATE_MODE_PROBLEM}; {CREATE_MODE_HINT}"))
    return problems


def _value_problems(entries: dict[str, tuple[int, str]],
                    version: SlurmVersion) -> list[Problem]:
    problems = []
    env_file = entries.get("CreateEnvFile")
    allowed = ({"true", "false"} if version < SlurmVersion(23, 2)
               else {"true", "false", "null", "newline", "disabled"})
    if env_file is not None and env_file[1].lower() not in allowed:
        problems.append(Problem(env_file[0], f"CreateEnvFile must be one of "
                                             f"{'|'.join(sorted(allowed))} for Slurm {version}"))
    env_enabled = env_file is not None and env_file[1].lower() not in ("false", "disabled")
    for name, (number, value) in entries.items():
        if "%e" in value.replace("%%", "") and not env_enabled:
            problems.append(Problem(number, f"{name} uses %e but CreateEnvFile is not enabled"))
    for name in ("DisableCleanup", "IgnoreFileConfigJson"):
        entry = entries.get(name)
        if entry is not None and entry[1].lower() not in ("true", "false", "yes", "no"):
            problems.append(Problem(entry[0], f"{name} must be true or false"))
    for name in ("EnvExclude", "RunTimeEnvExclude"):
        entry = entries.get(name)
        if entry is not None:
            try:
                re.compile(entry[1])
            except re.error as exc:
                problems.append(Problem(entry[0], f"{name} is not a regular expression: {exc}"))
    return problems


#: the release whose ContainerPath names the parent of the per-step spool directories
CONTAINER_PATH_PARENT = SlurmVersion(25, 5)
#: the release that replaced JobContainerType with NamespaceType
NAMESPACE_TYPE = SlurmVersion(25, 11)
#: directories namespace/linux (25.11) and namespace/tmpfs make private to each job
PER_JOB_DIRS = ("/tmp", "/dev/shm")


def _release_problems(entries: dict[str, tuple[int, str]],
                      version: SlurmVersion) -> list[Problem]:
    """What changed meaning between releases (container.c _generate_spooldir*):
    before 25.05 ContainerPath is each task's spool directory pattern (default
    ``%m/oci-job%j-%s/task-%t/``); from 25.05 it is their parent, and slurmstepd appends
    ``oci-job<job>-<step>/task-<task>`` (and MountSpoolDir defaults to that path)."""
    entry = entries.get("ContainerPath")
    if entry is None:
        return []
    number, value = entry
    tokens = set(re.findall(r"%(.)", value.replace("%%", "")))
    if version < CONTAINER_PATH_PARENT and not {"j", "s", "t"} <= tokens:
        return [Problem(number, f"ContainerPath is each task's spool directory in Slurm "
                                f"{version} (before 25.05): without %j, %s and %t jobs, steps "
                                "and tasks share it (default %m/oci-job%j-%s/task-%t/)")]
    if version >= CONTAINER_PATH_PARENT and "t" in tokens:
        return [Problem(number, f"ContainerPath is the parent of the per-step directories in "
                                f"Slurm {version} (25.05 and later append "
                                "oci-job<job>-<step>/task-<task>): drop %t, a pattern written "
                                "for an older release nests")]
    return []


def lint_slurm_conf(text: str, version: SlurmVersion) -> list[Problem]:
    """The slurm.conf settings whose name changed in 25.11: ``JobContainerType`` became
    ``NamespaceType`` (job_container/tmpfs -> namespace/tmpfs)."""
    problems = []
    for number, raw in enumerate(text.splitlines(), start=1):
        key, _, value = _strip_comment(raw).strip().partition("=")
        key, value = key.strip().lower(), value.strip()
        if key == "jobcontainertype" and version >= NAMESPACE_TYPE and value.lower() != "none":
            problems.append(Problem(number, f"JobContainerType is gone in Slurm {version}: "
                                            "use NamespaceType="
                                            + value.replace("job_container/", "namespace/")))
        elif key == "namespacetype" and version < NAMESPACE_TYPE:
            problems.append(Problem(number, f"NamespaceType is unknown to Slurm {version} "
                                            "(added in 25.11): use JobContainerType="
                                            + value.replace("namespace/", "job_container/")))
    return problems


def per_job_dir(path: str, version: SlurmVersion) -> str | None:
    """The per-job directory ``path`` lies in on ``version`` (namespace/linux and
    namespace/tmpfs, 25.11, give each job its own /tmp and /dev/shm), or None: a node-local
    stage target there is invisible to the next job and lost when the job ends."""
    if version < NAMESPACE_TYPE:
        return None
    for directory in PER_JOB_DIRS:
        if path == directory or path.startswith(directory + "/"):
            return directory
    return None
