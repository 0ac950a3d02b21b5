"""``python -m bench trust``: a warm ``ocistage bundle`` under a policy with one ``signedBy``
scope against the same under an accept-anything policy (Debian's default), side by side.

Issue 35's goal: the signed case costs at most 10% more. The image is a small synthetic one
(:mod:`bench.synthetic`, ``--files`` files of ``--megabytes`` MB), pushed to a
``docker-registry`` on 127.0.0.1 and signed there by ``skopeo copy --sign-by`` with a key made
in a throwaway GNUPGHOME, its signature in a ``file://`` lookaside of the bench's own. One cold
bundle fills the cache (and keeps the signature with the image); then, in alternating order:

- ``accept missing``    ``bundle --pull missing REF`` (the cached bundle; no network)
- ``signed missing``    the same under the ``signedBy`` policy (the kept signature verified)
- ``accept always``     ``bundle REF`` (the registry asked for the manifest)
- ``signed always``     the same under the ``signedBy`` policy (the lookaside read again)

Medians and ratios are printed, raw samples written to ``bench/results/trust-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from bench.bundle import RESULTS, Sample, Workspace, run_alternating, run_timed, running_registry
from bench.images import MB, cache_root
from bench.synthetic import SynthSpec, build_synthetic
from ocistage.bundler.trust.gpg import clean_home
from ocistage.cache.treeremoval import remove_tree

CASES = ("accept missing", "signed missing", "accept always", "signed always")


def ocistage_argv() -> list[str]:
    beside = Path(sys.executable).parent / "ocistage"
    return [str(beside)] if beside.is_file() else [sys.executable, "-m", "ocistage"]


def signing_key(home: Path) -> str:
    """A new key in GnuPG home ``home``; its fingerprint."""
    gpg = ["gpg", f"--homedir={home}", "--batch", "--no-tty", "--pinentry-mode=loopback",
           "--passphrase="]
    subprocess.run([*gpg, "--quick-gen-key", "Bench <bench@example>", "default", "default",
                    "never"], check=True, capture_output=True)
    listing = subprocess.run([*gpg, "--with-colons", "--list-keys"], check=True,
                             capture_output=True, text=True).stdout
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench trust", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=9, help="repetitions per case [9]")
    parser.add_argument("--files", type=int, default=1000, help="files in the image [1000]")
    parser.add_argument("--megabytes", type=int, default=20, help="bytes of files, MB [20]")
    args = parser.parse_args(argv)
    missing = [t for t in ("docker-registry", "skopeo", "gpg") if not shutil.which(t)]
    if missing:
        print(f"bench: missing {', '.join(missing)}", file=sys.stderr)
        return 1
    image = build_synthetic(SynthSpec(args.files, args.megabytes * MB), ("gzip",))["gzip"]
    root = cache_root()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    load = os.getloadavg()
    sockets = Path("/run/user") / str(os.getuid()) / "gnupg"  # gpg's socket directories
    sockets_existed = sockets.is_dir()
    base = Path(tempfile.mkdtemp(prefix="ocistage-bench-trust-"))
    gnupg = base / "gnupg"
    gnupg.mkdir(mode=0o700)
    work = Workspace(root / f"trust-work-{os.getpid()}")
    try:
        fingerprint = signing_key(gnupg)
        key = base / "key.gpg"
        key.write_bytes(subprocess.run(["gpg", f"--homedir={gnupg}", "--export", fingerprint],
                                       check=True, capture_output=True).stdout)
        registries_d = base / "registries.d"
        registries_d.mkdir()
        (registries_d / "bench.yaml").write_text(
            f"default-docker:\n  lookaside: file://{base / 'lookaside'}\n"
            f"  lookaside-staging: file://{base / 'lookaside'}\n")
        accept = base / "accept.json"
        accept.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        with running_registry(root / "registry" / "storage") as registry:
            ref = f"{registry.host}/bench-trust/{image.name}:signed"
            subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                            f"--registries.d={registries_d}", f"--sign-by={fingerprint}",
                            f"oci:{image.layout}:{image.name}", f"docker://{ref}"],
                           check=True, stdin=subprocess.DEVNULL,
                           env={**os.environ, "GNUPGHOME": str(gnupg)})
            signed = base / "signed.json"
            signed.write_text(json.dumps({
                "default": [{"type": "reject"}], "transports": {"docker": {registry.host: [
                    {"type": "signedBy", "keyType": "GPGKeys", "keyPath": str(key)}]}}}))
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("OCISTAGE_")},
                   "OCISTAGE_CACHE": str(base / "cache"), "NO_PROXY": "127.0.0.1,localhost"}

            def bundle(policy: Path, pull: str) -> Callable[[], Sample]:
                def run() -> Sample:
                    seconds, rss, _ = run_timed(
                        [*ocistage_argv(), "bundle", "-q", f"--pull={pull}",
                         f"--policy={policy}", f"--registries.d={registries_d}", ref],
                        env=env, sync=False)
                    return Sample(seconds, rss)
                return run

            bundle(signed, "always")()  # cold: fills the cache, keeps the signature
            runners = {"accept missing": bundle(accept, "missing"),
                       "signed missing": bundle(signed, "missing"),
                       "accept always": bundle(accept, "always"),
                       "signed always": bundle(signed, "always")}
            samples = run_alternating(image.name, runners, max(1, args.reps), work,
                                      cold=lambda _name: False, report=True)
    finally:
        remove_tree(work.root)
        clean_home(str(gnupg))
        shutil.rmtree(base, ignore_errors=True)
        if not sockets_existed and sockets.is_dir() and not any(sockets.iterdir()):
            sockets.rmdir()
    medians = {name: statistics.median(s.seconds for s in values)
               for name, values in samples.items()}
    result = {"when": stamp, "reps": args.reps, "cpus": os.cpu_count(), "load_before": load,
              "load_after": os.getloadavg(),
              "samples": {n: [asdict(s) for s in v] for n, v in samples.items()},
              "medians": medians}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"trust-{stamp}.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    for name, median in medians.items():
        print(f"{name:16} median {median:7.3f} s, min "
              f"{min(s.seconds for s in samples[name]):7.3f} s")
    for pull in ("missing", "always"):
        ratio = medians[f"signed {pull}"] / medians[f"accept {pull}"]
        print(f"--pull {pull}: signedBy / accept-anything {ratio:.3f} (goal <= 1.10)")
    print(f"bench: raw samples in {out}")
    return 0
