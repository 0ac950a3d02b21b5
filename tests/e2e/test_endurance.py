"""Endurance (soak) of a group-shared cache (issue 39): three created users and root, members of
one group, share a group cache and a pyxis store and each have a private cache, all on one
small tmpfs that fills up; they bundle, stage into one sticky target, unstage, ``cache gc``,
``cache verify`` and ``ocistage-pyxis-importer get``/``release`` at random for
``OCISTAGE_SOAK_SECONDS`` (default 120) while a controller SIGKILLs random commands.

Every command's stderr is checked as it ends: never a traceback or an internal error, and a
failure only for a reason the run makes legitimate (:data:`ALLOWED`). At the end nothing of the
users is left running, nothing is mounted below the test's directory, ``cache verify`` finds
nothing corrupt and nothing was ever quarantined, and every member can still bundle and stage.

Randomness is seeded (``OCISTAGE_SOAK_SEED``, else a new seed; printed): a failing run says how
to repeat its choices (the interleaving of four users on a busy machine is not repeatable).
Every command, its exit status and its output go to ``soak-log.jsonl`` in the test's tmp_path.

Run alone (as root, ~3.5 minutes with the default 120 s on 2 cores)::

    OCISTAGE_SOAK_SECONDS=120 .venv/bin/python -m pytest -q tests/e2e/test_endurance.py

A failure lists each kind of problem once (its first occurrence in full, with a count), then
the outcome of every operation, the slowest commands and what landed in a quarantine.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_ocistage.components import Registry, component_unavailable, require_binary
from pytest_ocistage.imagebuild import WHITEOUT, Dir, Entry, File
from pytest_ocistage.plugin import ImageFactory
from pytest_ocistage.runner import ocistage_command
from tests.soak import Member, group_members, kill_processes_of, mounts_under, processes_of, tmpfs

SOAK_SECONDS = float(os.environ.get("OCISTAGE_SOAK_SECONDS", "120"))
USERS = 3
FS_SIZE = "320m"        # the images below are ~40 MB: a cache holding both is ~100 MB
FINAL_FS_SIZE = "640m"  # the last round (every member bundles and stages once more)
LEFT_AFTER_GC = 32 << 20  # what may stay held once everything is released and collected
MAX_KILLS = 20
KILL_EVERY = (1.0, 6.0)  # seconds between the controller's kills, drawn uniformly
COMMAND_TIMEOUT = 75.0   # a command still running after this is hung
DRAIN_SECONDS = 20.0     # after the soak, commands still running get this long, then are cut
FINAL_SECONDS = 75.0     # the clean-up's budget (release, unstage, gc, verify) and
USABLE_SECONDS = 45.0    # the last bundles' and stages': a command not done by then failed
MAX_OPS = 2000           # per member: bounds the loop whatever the clock does

pytestmark = [
    pytest.mark.e2e, pytest.mark.timeout(int(SOAK_SECONDS) + 600),
    pytest.mark.needs_root("the endurance test creates users and mounts a tmpfs")]

#: The failures a command may end with during the soak (not after it): the filesystem is
#: meant to fill up, and every command then fails cleanly with ENOSPC's message. Nothing
#: else: a refusal of a member's directory, a lock that times out, a snapshot or bundle
#: another member cannot read are the bugs this test is for.
ALLOWED = re.compile(r"no space left", re.IGNORECASE)
FORBIDDEN = re.compile(r"Traceback|internal error", re.IGNORECASE)


@dataclass(frozen=True)
class Image:
    name: str
    ref: str     # 127.0.0.1:PORT/soak/NAME:1
    uri: str     # the same as pyxis gives it to the importer (enroot's syntax)


@dataclass
class Record:
    member: str
    op: str
    argv: tuple[str, ...]
    cache: str
    phase: str
    started: float
    seconds: float = 0.0
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    killed: bool = False
    hung: bool = False
    cut: bool = False      # killed (or not started) at the end of its phase


    def describe(self) -> str:
        how = "SIGKILLed by the controller" if self.killed else \
            "hung (killed after the timeout)" if self.hung else \
            "cut at the end of its phase" if self.cut else f"exit {self.returncode}"
        return (f"[{self.phase} t+{self.started:.1f}s] {self.member}: "
                f"{' '.join(self.argv)} (OCISTAGE_CACHE={self.cache}): {how}\n"
                f"    stderr: {self.stderr.strip()[-1500:]!r}")


@dataclass
class Running:
    process: subprocess.Popen[str]
    record: Record


@dataclass
class Soak:
    """The directories on the tmpfs, the members and the commands they ran."""

    base: Path           # root's 0755 directory in /tmp holding everything
    fs: Path             # the tmpfs
    group: int
    members: list[Member]
    images: list[Image]
    seed: int
    log: Path
    problems: list[tuple[str, str]] = field(default_factory=list)  # (kind, what happened)
    records: list[Record] = field(default_factory=list)
    running: dict[int, Running] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    start: float = field(default_factory=time.monotonic)
    peak_used: float = 0.0
    phase: str = "soak"
    phase_end: float = float("inf")   # no command of the phase runs beyond this
    notes: list[str] = field(default_factory=list)  # for the summary
    leftover_jobs: dict[str, list[str]] = field(default_factory=dict)  # not released
    leftover_stages: dict[str, dict[str, Path]] = field(default_factory=dict)  # name -> cache

    @property
    def group_cache(self) -> Path:
        return self.fs / "group-cache"

    @property
    def store(self) -> Path:
        return self.fs / "pyxis-store"

    @property
    def stage(self) -> Path:
        return self.fs / "stage"

    def private(self, member: Member) -> Path:
        return self.fs / "private" / member.name

    # -- running commands -------------------------------------------------------------------

    def environment(self, member: Member, cache: Path,
                    extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:"
                        "/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": str(member.home), "USER": member.name, "LOGNAME": member.name,
                "LANG": "C.UTF-8", "XDG_CONFIG_HOME": str(member.home / ".config"),
                "XDG_CACHE_HOME": str(member.home / ".cache"),
                "OCISTAGE_CACHE": str(cache), "OCISTAGE_PYXIS_STORE": str(self.store),
                "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                **(extra or {})}

    def run(self, member: Member, op: str, command: Sequence[str], cache: Path,
            extra: dict[str, str] | None = None) -> Record:
        """``command`` as ``member`` (the group a supplementary group, umask 002), in a session
        of its own (the controller kills the whole session); checked and logged."""
        argv = ["setpriv", f"--reuid={member.uid}", f"--regid={member.gid}",
                f"--groups={self.group}", "sh", "-c", 'umask 002; exec "$@"', "sh", *command]
        record = Record(member.name, op, tuple(command), str(cache), self.phase,
                        time.monotonic() - self.start)
        began = time.monotonic()
        if began >= self.phase_end:
            record.cut = True
            return self.finish(record)
        process = subprocess.Popen(argv, env=self.environment(member, cache, extra), cwd="/",
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, errors="replace",
                                   start_new_session=True)
        with self.lock:
            self.running[process.pid] = Running(process, record)
        try:
            record.stdout, record.stderr = process.communicate(
                timeout=min(COMMAND_TIMEOUT, self.phase_end - began))
        except subprocess.TimeoutExpired:
            record.hung = time.monotonic() - began >= COMMAND_TIMEOUT
            record.cut = not record.hung
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            record.stdout, record.stderr = process.communicate()
        finally:
            with self.lock:
                del self.running[process.pid]
        record.returncode = process.returncode
        record.seconds = time.monotonic() - began
        return self.finish(record)

    def finish(self, record: Record) -> Record:
        self.check(record)
        with self.lock:
            self.records.append(record)
            with self.log.open("a") as log:
                log.write(json.dumps(record.__dict__) + "\n")
        return record

    def problem(self, text: str, record: Record | None = None, detail: str = "") -> None:
        """Note a problem; those of one kind (the phase, the operation and the first error
        line without what varies: users, paths, numbers) are reported together."""
        if record is None:
            kind = text
        else:
            first = next((line for line in record.stderr.splitlines()
                          if line.startswith("error")), "")
            kind = f"{record.phase}/{record.op}: {text} {first}"
        kind = re.sub(r"/tmp/ocistage-soak-\w+|127\.0\.0\.1:\d+|[0-9a-f]{8,}", "", kind)
        kind = re.sub(r"\d+|osk\w+|soak/\w+|private|layers|tiny", "", kind)
        text += f" {detail}" if detail else ""
        if record is not None:
            text = f"{text}: {record.describe()}"
        with self.lock:
            self.problems.append((kind, text))

    def report(self) -> str:
        """Each kind of problem once (the first of its kind in full), with how often."""
        kinds: dict[str, list[str]] = {}
        for kind, text in self.problems:
            kinds.setdefault(kind, []).append(text)
        return "\n".join(f"({len(texts)}x) {texts[0]}" for texts in kinds.values())

    def check(self, record: Record) -> None:
        if FORBIDDEN.search(record.stderr):
            self.problem("a traceback or internal error", record)
        elif record.hung:
            self.problem(f"no end within {COMMAND_TIMEOUT:.0f} s", record)
        elif record.cut:
            if record.phase != "soak":
                self.problem("not done within the final phase's budget", record)
        elif record.returncode != 0 and not record.killed:
            errors = [line for line in record.stderr.splitlines() if line.startswith("error")]
            if not errors or record.phase != "soak" or \
                    not all(ALLOWED.search(e) for e in errors):
                self.problem("failed", record)
        if record.op == "verify" and not record.killed and record.stdout.strip():
            with contextlib.suppress(json.JSONDecodeError):
                found = json.loads(record.stdout).get("problems") or []
                if found:
                    kinds = sorted({str(problem.get("kind")) for problem in found})
                    self.problem(f"cache verify found {kinds}", record,
                                 json.dumps(found)[:1500])

    def kill_everything(self) -> None:
        with self.lock:
            for pid, running in self.running.items():
                if running.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)

    # -- the controller ---------------------------------------------------------------------

    def controller(self, until: float) -> None:
        """SIGKILL a random running command every few seconds (at most MAX_KILLS), and note
        how full the filesystem got."""
        rng = random.Random(self.seed)
        kills = 0
        while not self.stop.wait(rng.uniform(*KILL_EVERY)) and time.monotonic() < until:
            self.note_usage()
            if kills >= MAX_KILLS:
                continue
            with self.lock:
                candidates = sorted((pid for pid, r in self.running.items()
                                     if r.process.poll() is None and r.record.phase == "soak"))
                if not candidates:
                    continue
                victim = self.running[rng.choice(candidates)]
                victim.record.killed = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(victim.process.pid, signal.SIGKILL)
            kills += 1

    def note_usage(self) -> None:
        st = os.statvfs(self.fs)
        used = 1 - st.f_bavail / st.f_blocks
        self.peak_used = max(self.peak_used, used)

    # -- what a member does -----------------------------------------------------------------

    def stage_name(self, member: Member, image: Image, shared: bool) -> str:
        return f"{member.name}-{image.name}-{'group' if shared else 'own'}"

    def worker(self, index: int, member: Member, until: float) -> None:
        rng = random.Random(self.seed + 1 + index)
        staged: dict[str, Path] = {}     # stage name -> the cache it was staged with
        jobs: list[str] = []             # importer job ids not released yet
        ops = ("bundle", "stage", "squashfs", "unstage", "gc", "verify", "importer")
        weights = (20, 16, 6, 10, 12, 8, 15)
        try:
            for number in range(MAX_OPS):
                if time.monotonic() >= until or self.stop.is_set():
                    break
                self.note_usage()
                op = rng.choices(ops, weights)[0]
                image = rng.choice(self.images)
                shared = rng.random() < 0.6
                cache = self.group_cache if shared else self.private(member)
                if op == "unstage" and staged:
                    name = rng.choice(sorted(staged))
                    if self.run(member, op, [*ocistage_command(), "unstage", "--missing-ok",
                                             str(self.stage / name)],
                                staged[name]).returncode == 0:
                        del staged[name]
                elif op in ("stage", "unstage", "squashfs"):
                    # squashfs: root mounts it (squashfuse), the users unpack it (no FUSE)
                    name = self.stage_name(member, image, shared)
                    form = ["--format", "squashfs"] if op == "squashfs" else []
                    name += "-sqsh" if form else ""
                    done = self.run(member, f"stage{'-squashfs' if form else ''}",
                                    [*ocistage_command(), "stage", "-q", image.ref, "--to",
                                     str(self.stage), "--name", name, *form], cache)
                    staged[name] = cache    # also when killed: it may have been published
                    if done.returncode == 0 and done.stdout.strip() != str(self.stage / name):
                        self.problem("staged elsewhere than --to/--name", done)
                elif op == "bundle":
                    self.run(member, op, [*ocistage_command(), "bundle", "-q", image.ref], cache)
                elif op in ("gc", "verify"):
                    target = rng.choice((self.group_cache, self.group_cache,
                                         self.private(member), self.store))
                    args = ["cache", op, "--json", "--cache", str(target)]
                    if op == "gc" and rng.random() < 0.5:
                        args += ["--max-size", f"{rng.choice((16, 32, 64))}M"]
                    self.run(member, op, [*ocistage_command(), *args], target)
                else:
                    job = f"{(index + 1) * 100000 + number}"
                    jobs.append(job)
                    step = {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0"}
                    got = self.run(member, "importer-get",
                                   [importer_command(), "get", image.uri], cache, step)
                    if got.returncode == 0 and not Path(got.stdout.strip()).is_file():
                        self.problem("the image a get printed is not there", got)
                    if self.run(member, "importer-release", [importer_command(), "release"],
                                cache, step).returncode == 0:
                        jobs.remove(job)
        except Exception as exc:  # the test's own failure: reported, never swallowed
            self.problem(f"worker {member.name} failed: {exc!r}")
            raise
        finally:
            self.leftover_jobs[member.name] = jobs
            self.leftover_stages[member.name] = staged


def importer_command() -> str:
    beside = Path(sys.executable).parent / "ocistage-pyxis-importer"
    if not beside.is_file():
        component_unavailable(f"{beside} is missing: install ocistage into this venv "
                              "(make venv)")
    return str(beside)


# -- the images ------------------------------------------------------------------------------

def soak_images(oci_image: ImageFactory, registry: Registry, seed: int) -> list[Image]:
    """Three images of ~16 and ~24 MB (incompressible) and one tiny:

    - ``private``: 0700 directories holding 0755 ones with the data (what a member other than
      the one who unpacked it cannot traverse unless the cache opens it to the group), and a
      setuid file;
    - ``layers``: three layers, the upper ones replacing and deleting files of the lower;
    - ``tiny``: one small file.
    """
    rng = random.Random(seed)
    private: dict[str, Entry] = {
        "opt/private": Dir(0o700), "opt/private/open": Dir(0o755),
        "opt/private/open/deeper": Dir(0o755),
        "opt/private/open/data": File(rng.randbytes(12 << 20)),
        "opt/private/open/deeper/more": File(rng.randbytes(4 << 20)),
        "root": Dir(0o700), "root/.profile": "export A=1\n",
        "usr/bin/setuid-tool": File(b"#!/bin/sh\n", mode=0o4755),
        "etc/hostname": "soak\n"}
    lower: dict[str, Entry] = {f"srv/files/f{i:03}": File(rng.randbytes(2048))
                               for i in range(200)}
    lower.update({"srv/big-1": File(rng.randbytes(8 << 20)), "srv/replaced": "old\n"})
    middle: dict[str, Entry] = {"srv/big-2": File(rng.randbytes(8 << 20)),
                                "srv/replaced": "new\n", "srv/files/f000": WHITEOUT}
    upper: dict[str, Entry] = {"srv/big-3": File(rng.randbytes(8 << 20)),
                               "srv/big-1": WHITEOUT, "srv/x/y": Dir(0o700)}
    tiny: dict[str, Entry] = {"etc/hostname": "tiny\n"}
    built = {"private": oci_image(private, cmd=["/bin/sh"]),
             "layers": oci_image([lower, middle, upper], cmd=["/bin/sh"], compression="zstd"),
             "tiny": oci_image(tiny, cmd=["/bin/sh"])}
    images = []
    for name, image in built.items():
        pushed = image.push(registry, f"soak/{name}", "1")
        images.append(Image(name, pushed.ref, f"docker://{registry.host}#soak/{name}:1"))
    return images


# -- set-up ----------------------------------------------------------------------------------

@contextlib.contextmanager
def soak_setup(tmp_path: Path, images: list[Image], seed: int) -> Iterator[Soak]:
    """The tmpfs with the group cache (root's, 2775, the test group), the pyxis store (the
    same), the sticky 1777 stage target and each member's private 0700 cache, in a 0755
    directory of root's under /tmp; users made, and everything taken down at the end."""
    base = Path(tempfile.mkdtemp(prefix="ocistage-soak-", dir="/tmp"))
    base.chmod(0o755)
    (base / "home").mkdir(mode=0o755)
    prefix = f"osk{os.getpid() % 100000}u"
    try:
        with group_members(prefix, USERS, base / "home") as (group, members), \
                tmpfs(base / "fs", FS_SIZE) as fs:
            soak = Soak(base, fs, group, members, images, seed, tmp_path / "soak-log.jsonl")
            for shared in (soak.group_cache, soak.store):
                shared.mkdir()
                os.chown(shared, 0, group)
                shared.chmod(0o2775)
            soak.stage.mkdir()
            soak.stage.chmod(0o1777)
            (fs / "private").mkdir(mode=0o755)
            for member in members:
                soak.private(member).mkdir(mode=0o700)
                os.chown(soak.private(member), member.uid, member.gid)
            try:
                yield soak
            finally:
                soak.stop.set()
                soak.kill_everything()
                kill_processes_of({m.uid for m in members if m.created})
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- the test --------------------------------------------------------------------------------

def test_group_cache_endurance(oci_image: ImageFactory, oci_registry: Registry,
                               tmp_path: Path) -> None:
    for binary, package in (("setpriv", "util-linux"), ("useradd", "passwd"),
                            ("groupadd", "passwd"), ("mount", "mount"),
                            ("mksquashfs", "squashfs-tools")):
        require_binary(binary, package)
    importer_command()
    seed = int(os.environ.get("OCISTAGE_SOAK_SEED") or random.randrange(1 << 32))
    print(f"\nendurance: seed {seed} (OCISTAGE_SOAK_SEED={seed} repeats its choices), "
          f"{SOAK_SECONDS:.0f} s, log {tmp_path / 'soak-log.jsonl'}")
    images = soak_images(oci_image, oci_registry, seed)
    with soak_setup(tmp_path, images, seed) as soak:
        soak_phase(soak)
        final_phase(soak)
        problems, report, summary = soak.problems, soak.report(), summarise(soak)
    if problems:
        pytest.fail(f"{len(problems)} problem(s) (seed {seed}), each kind once:\n{report}\n"
                    f"{summary}", pytrace=False)
    print(summary)
    assert soak.peak_used > 0.9, \
        f"the filesystem never filled up (peak {soak.peak_used:.0%}): make the images larger"


def soak_phase(soak: Soak) -> None:
    until = time.monotonic() + SOAK_SECONDS
    soak.phase_end = until + DRAIN_SECONDS
    threads = [threading.Thread(target=soak.worker, args=(i, m, until), name=m.name)
               for i, m in enumerate(soak.members)]
    threads.append(threading.Thread(target=soak.controller, args=(until,), name="controller"))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=SOAK_SECONDS + DRAIN_SECONDS + 30)
        if thread.is_alive():
            soak.problem(f"{thread.name} did not stop")
    soak.stop.set()


def final_phase(soak: Soak) -> None:
    """Release and unstage what the soak left, give space back (``cache gc`` by each member),
    verify every cache, then each member bundles and stages once more; nothing may fail."""
    soak.phase, soak.phase_end = "final", time.monotonic() + FINAL_SECONDS
    ocistage = ocistage_command()
    for member in soak.members:
        for job in soak.leftover_jobs.get(member.name, []):
            soak.run(member, "importer-release", [importer_command(), "release"],
                     soak.group_cache, {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0"})
        for name, cache in sorted(soak.leftover_stages.get(member.name, {}).items()):
            soak.run(member, "unstage", [*ocistage, "unstage", "--missing-ok", "--force",
                                         str(soak.stage / name)], cache)
    for member in soak.members:
        soak.run(member, "gc", [*ocistage, "cache", "gc", "--json", "--max-size", "0"],
                 soak.private(member))
    for member in soak.members:   # each member collects the others' trees too
        for shared in (soak.group_cache, soak.store):
            soak.run(member, "gc", [*ocistage, "cache", "gc", "--json", "--max-size", "0",
                                    "--cache", str(shared)], shared)
    root = soak.members[-1]
    for shared in (soak.group_cache, soak.store):
        soak.run(root, "verify", [*ocistage, "cache", "verify", "--json", "--cache",
                                  str(shared)], shared)
    for member in soak.members:
        soak.run(member, "verify", [*ocistage, "cache", "verify", "--json"],
                 soak.private(member))
    for cache in (soak.group_cache, soak.store, *map(soak.private, soak.members)):
        quarantine = cache / "quarantine"
        quarantined = sorted(p.name for p in quarantine.glob("*")) if quarantine.is_dir() \
            else []
        if quarantined:
            size = disk_usage(quarantine)
            soak.notes.append(f"{quarantine}: {len(quarantined)} entries, {size >> 20} MiB")
            soak.problem(f"{quarantine.relative_to(soak.fs)} holds what was found corrupt or "
                         f"changed, though nothing was: {len(quarantined)} entries, "
                         f"{size >> 20} MiB", detail=str(quarantined[:10]))
    # what still holds space once everything was released and collected: each cache's space
    # reserve (1 MiB, cache/reserve.py) and little else, or gc did not give the space back
    held = {part.name: disk_usage(part) for part in sorted(soak.fs.iterdir())}
    soak.notes.extend(f"after the final gc: {name} {size >> 20} MiB" for name, size in held.items())
    if sum(held.values()) > LEFT_AFTER_GC:
        soak.problem(f"the final gc left {sum(held.values()) >> 20} MiB held", detail=str(held))
    # then room for the last round: four members' bundles and stages of both images, side by
    # side, nearly fill FS_SIZE alone (a deferred removal still running can tip it over)
    subprocess.run(["mount", "-o", f"remount,size={FINAL_FS_SIZE}", str(soak.fs)], check=True,
                   timeout=30, capture_output=True)
    soak.phase_end = time.monotonic() + USABLE_SECONDS
    by_name = {image.name: image for image in soak.images}
    private, layers = by_name["private"], by_name["layers"]
    for member in soak.members:   # stage REF bundles first: the 0700 image in the group cache
        name = f"final-{member.name}"
        staged = soak.run(member, "stage", [*ocistage, "stage", "-q", private.ref, "--to",
                                            str(soak.stage), "--name", name], soak.group_cache)
        if staged.returncode == 0:
            if Path(staged.stdout.strip()) != soak.stage / name:
                soak.problem("staged elsewhere than --to/--name", staged)
            soak.run(member, "unstage", [*ocistage, "unstage", str(soak.stage / name)],
                     soak.group_cache)
        for image, cache in ((layers, soak.group_cache), (private, soak.private(member))):
            made = soak.run(member, "bundle", [*ocistage, "bundle", "-q", image.ref], cache)
            if made.returncode == 0 and not (Path(made.stdout.strip()) / "rootfs").is_dir():
                soak.problem("the bundle printed has no rootfs", made)
    check_nothing_left(soak)


def check_nothing_left(soak: Soak) -> None:
    """No process of the users or with the test's directory on its command line outlives
    the commands (they get 15 s to end on their own), and nothing is mounted below it."""
    uids = {m.uid for m in soak.members if m.created}
    deadline = time.monotonic() + 15
    left = leftovers(soak, uids)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)   # polling /proc for processes to end, bounded by the deadline
        left = leftovers(soak, uids)
    if left:
        soak.problem(f"processes left running after every command ended: {left}")
        kill_processes_of(uids)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    mounted = [point for point in mounts_under(soak.base) if point != str(soak.fs)]
    if mounted:
        soak.problem(f"still mounted below {soak.base}: {mounted}")


def disk_usage(path: Path) -> int:
    """Bytes allocated below ``path`` (root reads every member's tree)."""
    total = 0
    for directory, names, files in os.walk(path):
        for name in names + files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total


def leftovers(soak: Soak, uids: set[int]) -> dict[int, str]:
    left = processes_of(uids)
    for pid, command in processes_of({0}).items():
        if str(soak.base) in command and pid != os.getpid():
            left[pid] = command
    return left


def summarise(soak: Soak) -> str:
    outcome: Counter[tuple[str, str]] = Counter()
    for record in soak.records:
        kind = "killed" if record.killed else "hung" if record.hung else \
            "cut" if record.cut else \
            "ok" if record.returncode == 0 else \
            "enospc" if ALLOWED.search(record.stderr) else "FAILED"
        outcome[(f"{record.phase}/{record.op}", kind)] += 1
    rows = sorted({op for op, _ in outcome})
    lines = [f"endurance summary: seed {soak.seed}, {len(soak.records)} commands, "
             f"peak use of the filesystem {soak.peak_used:.0%}"]
    for op in rows:
        counts = ", ".join(f"{kind} {n}" for (o, kind), n in sorted(outcome.items()) if o == op)
        lines.append(f"  {op:24} {counts}")
    lines.append("  slowest:")
    for record in sorted(soak.records, key=lambda r: -r.seconds)[:4]:
        lines.append(f"    {record.seconds:5.1f} s {record.describe()}")
    lines += [f"  {note}" for note in soak.notes]
    return "\n".join(lines)
