"""Run the ``ocistage`` CLI from a test, with a private cache, HOME and XDG directories.

:class:`OcistageRunner` runs a command line two ways:

- ``runner(*args)`` in-process (given ``timeout=``, as a process): ``ocistage.bundler.cli.app.run``
in
  this interpreter with ``sys.argv``, ``os.environ``, the working directory and the standard
  streams swapped for the call and restored after it. It returns an
  :class:`OcistageResult` (exit code, stdout, stderr, and ``.json``, the parsed stdout of a
  ``--json`` command). Fast (no interpreter start-up), but one at a time: do not call it
  from several threads. Output of child processes the CLI runs
  (``sbatch``, ``mksquashfs``) goes to the test's file descriptors, not into the result.
- ``runner.run_process(*args)``: the console script (or ``python -m``-style fallback) as a
  child process, for what needs a process of its own: a timeout, a kill mid-download,
  another user, a Slurm job. ``runner.command`` and ``runner.environment()`` give the argv
  prefix and environment for tests that start it themselves.

The cache is passed as ``OCISTAGE_CACHE`` (the documented equivalent of ``--cache``), so it
applies to every subcommand wherever the option sits. Every ``OCISTAGE_*`` variable, proxy and
credential-location variable of the test process is dropped from the command's environment.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_ocistage.components import Outcome, Registry

SCRUBBED_ENV = ("DOCKER_CONFIG", "REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME",
                "XDG_CACHE_HOME", "XDG_DATA_HOME", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
                "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY")
# what ocistage.bundler.cli.common.setup_logging uses
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def ocistage_command() -> list[str]:
    """The ``ocistage`` console script of this Python (its venv), else the one on PATH, else
    the CLI's ``main`` via this Python. Not simply the first on PATH: a pyenv shim or another
    checkout's install may come first when pytest runs with a venv's python not on PATH."""
    beside = Path(sys.executable).parent / "ocistage"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    script = shutil.which("ocistage")
    if script is not None:
        return [script]
    return [sys.executable, "-c", "from ocistage.bundler.cli.app import main; main()"]


@dataclass(frozen=True)
class OcistageResult(Outcome):
    """What one command line did: ``returncode`` (also ``exit_code``), stdout, stderr."""

    args: tuple[str, ...]

    @property
    def json(self) -> Any:
        """stdout parsed as JSON (for ``--json`` commands); a failure shows the output."""
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError:
            pytest.fail(f"ocistage {' '.join(self.args)} (exit {self.returncode}) printed no "
                        f"JSON:\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}", pytrace=False)


class _Capture(io.TextIOWrapper):
    """A text stream over a byte buffer (``.buffer`` exists, as on a real sys.stdout)."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="replace", write_through=True)

    def text(self) -> str:
        self.flush()
        raw = self.buffer
        assert isinstance(raw, io.BytesIO)
        return raw.getvalue().decode("utf-8", errors="replace")


@contextmanager
def _swapped_process_state(argv: Sequence[str], env: dict[str, str], cwd: Path,
                           stdin: str) -> Iterator[tuple[_Capture, _Capture]]:
    """sys.argv (``submit`` reads what follows ``--`` there), os.environ, cwd, the standard
    streams and a log handler, restored after."""
    saved_argv, saved_env, saved_cwd = sys.argv, dict(os.environ), os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    out, err = _Capture(), _Capture()
    root = logging.getLogger()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    verbose = any(arg in ("-v", "--verbose") for arg in argv)
    handler.setLevel(logging.DEBUG if verbose else logging.WARNING)
    saved_level = root.level
    try:
        sys.argv = ["ocistage", *argv]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
        # under pytest the root logger has handlers, so the CLI's basicConfig adds none
        root.addHandler(handler)
        root.setLevel(min(saved_level or logging.WARNING, handler.level))
        yield out, err
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_level)
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv


@dataclass(frozen=True)
class OcistageRunner:
    """Runs the CLI with a private cache, HOME and XDG dirs (see the module docstring).

    ``home`` is the command's HOME: tests write ``home/.docker/config.json`` there (see
    :meth:`write_docker_auth`) or ``home/.config/ocistage/config.toml``.
    """

    command: tuple[str, ...]
    cache: Path
    home: Path
    cwd: Path

    @classmethod
    def in_directory(cls, directory: Path, cache: Path | None = None) -> OcistageRunner:
        """A runner whose HOME, cache (unless given) and cwd are inside directory."""
        home = directory / "home"
        (home / "run").mkdir(parents=True, mode=0o700, exist_ok=True)
        return cls(command=tuple(ocistage_command()),
                   cache=cache if cache is not None else directory / "cache",
                   home=home, cwd=directory)

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in SCRUBBED_ENV and not k.startswith("OCISTAGE_")
               and k != "PYTEST_CURRENT_TEST"}
        env.update({"HOME": str(self.home), "OCISTAGE_CACHE": str(self.cache),
                    "XDG_CACHE_HOME": str(self.home / ".cache"),
                    "XDG_CONFIG_HOME": str(self.home / ".config"),
                    "XDG_RUNTIME_DIR": str(self.home / "run"),
                    "NO_COLOR": "1", "COLUMNS": "200", "NO_PROXY": "127.0.0.1,localhost"})
        env.update(extra or {})
        return env

    def write_docker_auth(self, registry: Registry, username: str | None = None,
                          password: str | None = None) -> Path:
        """Add credentials for registry to ``home/.docker/config.json`` (what `docker login`
        writes); defaults to the registry's own username/password."""
        username = username if username is not None else registry.username
        password = password if password is not None else registry.password
        if username is None or password is None:
            raise ValueError(f"no credentials for {registry.host}")
        path = self.home / ".docker" / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        config = json.loads(path.read_text()) if path.exists() else {}
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        config.setdefault("auths", {})[registry.host] = {"auth": token}
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
        return path

    def __call__(self, *args: str, env: Mapping[str, str] | None = None,
                 input: str | None = None, timeout: float | None = None,
                 check: bool = False) -> OcistageResult:
        """Run ``ocistage ARGS`` in this process; with a timeout, as a child process (only a
        process can be stopped when time is up)."""
        if timeout is not None:
            return self.run_process(*args, env=env, input=input, timeout=timeout, check=check)
        from ocistage.bundler.cli.app import run  # the CLI loads only when a test runs it

        with _swapped_process_state(args, self.environment(env), self.cwd,
                                    input or "") as (out, err):
            code = run(args)
            stdout, stderr = out.text(), err.text()
        return self._checked(OcistageResult(code, stdout, stderr, tuple(args)), check)

    def run_process(self, *args: str, env: Mapping[str, str] | None = None,
                    input: str | None = None, timeout: float = 300,
                    check: bool = False) -> OcistageResult:
        """Run ``ocistage ARGS`` as a child process (for timeouts, signals, other users)."""
        result = subprocess.run([*self.command, *args], env=self.environment(env),
                                cwd=self.cwd, input=input, capture_output=True, text=True,
                                timeout=timeout, stdin=None if input is not None
                                else subprocess.DEVNULL)
        return self._checked(OcistageResult(result.returncode, result.stdout, result.stderr,
                                            tuple(args)), check)

    @staticmethod
    def _checked(result: OcistageResult, check: bool) -> OcistageResult:
        if check and result.returncode != 0:
            pytest.fail(f"ocistage {' '.join(result.args)} exited {result.returncode}:\n"
                        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}", pytrace=False)
        return result
