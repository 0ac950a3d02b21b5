"""The CLI's start-up imports: ``--help`` and the light commands must not load the heavy library.

Every ``ocistage`` command line (and every Slurm job's ``scrun stage-in`` hook) pays for what
``ocistage.bundler.cli.app`` imports. The command modules import the library inside the commands;
these
tests run a fresh interpreter and look at ``sys.modules``, so an eager import added back at the
top of a CLI module fails here (no timing involved).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# what a command line that does not fetch, validate or stage must not load
HEAVY = frozenset({
    "requests", "urllib3", "charset_normalizer", "jsonschema", "referencing", "fsspec",
    "zstandard", "rich.table", "rich.progress",
    "ocistage.bundler.registry.client", "ocistage.bundler.registry.transport",
    "ocistage.bundler.pull", "ocistage.bundler.flows.bundle",
    "ocistage.bundler.image.schema", "ocistage.bundler.runtime_config",
    "ocistage.bundler.settings", "ocistage.bundler.unpack.layerchain",
    "ocistage.bundler.follower", "ocistage.bundler.rootfs", "ocistage.bundler.unpack.apply",
    "ocistage.bundler.unpack.tarstream",
    "ocistage.bundler.inspect", "ocistage.cache.gc", "ocistage.cache.inventory",
    "ocistage.cache.listing", "ocistage.cache.diskusage", "ocistage.cache.gcplan",
    "ocistage.cache.leftovers", "ocistage.cache.leaseexpiry",
    "ocistage.cache.verify", "ocistage.cache.store", "ocistage.cache.ingest",
    "ocistage.stagers.directory", "ocistage.stagers.remote", "ocistage.runtimes.scrun",
    "ocistage.runtimes.submit",
    "pytest", "pytest_ocistage",  # the test plugin: never loaded by a command line
})
# the third-party libraries behind fetching, validating and remote staging
THIRD_PARTY = frozenset({"requests", "urllib3", "charset_normalizer", "jsonschema",
                         "referencing", "fsspec", "zstandard"})

_PROBE = """
import atexit, json, sys
sys.argv = ["ocistage", *json.loads(sys.argv[1])]
# the command ends the process itself (exitstatus.end_process), after the atexit handlers
atexit.register(lambda: sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n"))
from ocistage.bundler.cli.app import main
main()
"""


def _modules_after(argv: list[str], tmp_path: Path) -> set[str]:
    env = {**os.environ, "OCISTAGE_CACHE": str(tmp_path / "cache"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "COLUMNS": "100"}
    env.pop("SLURM_JOB_ID", None)
    cwd = tmp_path / "cwd"  # python -c puts the cwd first on sys.path: no cache/ dir there
    cwd.mkdir(exist_ok=True)
    result = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argv)], cwd=cwd,
                            env=env, capture_output=True, text=True, timeout=120, check=False)
    marker = result.stderr.rfind("MODULES ")
    assert marker >= 0, result.stderr
    return set(json.loads(result.stderr[marker + len("MODULES "):]))


def test_importing_the_cli_loads_no_library_module(tmp_path: Path) -> None:
    code = "import json, sys, ocistage.bundler.cli.app; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=True)
    loaded = set(json.loads(result.stdout))
    # the probe sees imports
    assert {"ocistage.bundler.cli.app", "ocistage.bundler.cli.common", "typer"} <= loaded
    assert sorted(HEAVY & loaded) == []


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["bundle", "--help"],
    ["pull", "--help"],
    ["stage", "--help"],
    ["unstage", "--help"],
    ["submit", "--help"],
    ["cache", "ls", "--help"],
    ["cache", "gc", "--help"],
    ["runtime", "oci-conf", "--help"],
    ["scrun", "stage-in", "--help"],
    ["scrun", "stage-out", "--help"],
])
def test_help_loads_no_library_module(argv: list[str], tmp_path: Path) -> None:
    loaded = _modules_after(argv, tmp_path)
    assert "ocistage.bundler.cli.app" in loaded
    assert sorted(HEAVY & loaded) == []


def test_runtime_commands_load_no_library_module(tmp_path: Path) -> None:
    for argv in (["runtime", "oci-conf", "--slurm-version", "23.11"],
                 ["runtime", "docker-config"],
                 ["runtime", "scrun-lua", "--ocistage", "/usr/bin/ocistage"]):
        loaded = _modules_after(argv, tmp_path)
        assert "ocistage.runtimes.oci_conf" in loaded
        assert sorted((THIRD_PARTY | {"ocistage.bundler.pull", "ocistage.bundler.flows.bundle",
                                      "ocistage.stagers.directory"})
                      & loaded) == [], argv


def test_cache_ls_loads_neither_schemas_nor_stagers(tmp_path: Path) -> None:
    loaded = _modules_after(["cache", "ls"], tmp_path)
    assert "ocistage.cache.listing" in loaded
    assert sorted({"jsonschema", "ocistage.bundler.image.schema", "ocistage.bundler.flows.bundle",
                   "ocistage.stagers.directory",
                   "rich.progress"} & loaded) == []


def test_commands_that_talk_to_no_registry_load_no_http_client(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "rootfs").mkdir(parents=True)
    (tree / "rootfs" / "file").write_text("x")
    (tree / "config.json").write_text("{}")
    staged = tmp_path / "staged"
    staged.mkdir()
    for argv in (["cache", "ls"], ["stage", str(tree), "--to", str(staged)],
                 ["unstage", str(staged / "tree")]):
        loaded = _modules_after(argv, tmp_path)
        assert "ocistage.bundler.settings" in loaded, argv  # the command ran and read the settings
        assert sorted({"requests", "urllib3", "ocistage.bundler.registry.client",
                       "ocistage.bundler.registry.transport",
                       "ocistage.bundler.pull"} & loaded) == [], argv


def test_doctor_loads_the_http_client_only_to_ask_a_registry(tmp_path: Path) -> None:
    """``ocistage doctor`` reads the settings and probes the host; requests and the registry
    client come in only with REF or --registry, the stagers, the store and the unpacking
    machinery never."""
    never = {"ocistage.cache.store", "ocistage.stagers.directory", "ocistage.bundler.pull",
             "ocistage.bundler.flows.bundle", "jsonschema", "zstandard", "fsspec", "rich.table"}
    alone = _modules_after(["doctor", "--json"], tmp_path)
    assert {"ocistage.bundler.doctor", "ocistage.bundler.settings"} <= alone
    assert sorted((never | {"requests", "ocistage.bundler.registry.client"}) & alone) == []
    asking = _modules_after(["doctor", "--registry", "127.0.0.1:9"], tmp_path)
    assert "ocistage.bundler.registry.client" in asking
    assert sorted(never & asking) == []


def test_staging_a_directory_loads_no_remote_or_config_machinery(tmp_path: Path) -> None:
    """The most common stage (a local tree, no config file) loads neither the fsspec/tar/
    squashfs-upload module nor the TOML parser (a re-stage of an unchanged tree is about as
    fast as ``rsync -a``, so the start-up is a visible part of it)."""
    tree = tmp_path / "tree"
    (tree / "rootfs").mkdir(parents=True)
    (tree / "config.json").write_text("{}")
    staged = tmp_path / "staged"
    staged.mkdir()
    for _ in range(2):  # first stage, then a re-stage
        loaded = _modules_after(["stage", str(tree), "--to", str(staged)], tmp_path)
        assert "ocistage.stagers.directory" in loaded
        assert sorted({"ocistage.stagers.remote", "ocistage.stagers.allnodes", "tomllib", "tarfile"}
                      & loaded) == []
    assert (staged / "tree" / "config.json").is_file()
    config = tmp_path / "config" / "ocistage"
    config.mkdir(parents=True)
    (config / "config.toml").write_text("jobs = 4\n")
    assert "tomllib" in _modules_after(["stage", str(tree), "--to", str(staged)], tmp_path)


def test_bundling_from_an_image_layout_loads_no_http_client(tmp_path: Path) -> None:
    from tests.bundler.tarbuilder import build_tar, file, write_oci_layout

    write_oci_layout(tmp_path / "layout", [build_tar([file("hello.txt", b"hello")])],
                     tag="v1", kind="gzip")
    unpacking = {"ocistage.bundler.rootfs", "ocistage.bundler.unpack.layerchain",
                 "ocistage.bundler.unpack.apply", "ocistage.bundler.unpack.tarstream",
                 "ocistage.cache.snapshots"}
    argv = ["bundle", "-q", "--cmd", "true", f"oci:{tmp_path / 'layout'}:v1"]
    for n in range(2):  # cold, then found in the cache
        loaded = _modules_after(argv, tmp_path)
        [made] = (tmp_path / "cache" / "bundles").iterdir()
        assert (made / "config.json").is_file()
        assert "ocistage.bundler.flows.bundle" in loaded and "ocistage.bundler.sources" in loaded
        assert sorted({"requests", "urllib3", "ocistage.bundler.registry.client",
                       "ocistage.bundler.registry.transport"}
                      & loaded) == [], argv
        # a bundle found in the cache needs none of the unpacking machinery
        assert sorted(unpacking & loaded) == (sorted(unpacking) if n == 0 else []), n



# what a bundle found in the cache does without (G4: a warm `bundle REF --pull missing` within
# 2x `ocistage --version`, docs/performance.md): the HTTP client, the signature machinery a
# policy without signedBy never asks, the config writer, archives' readers, a pool of threads
# for layers that are all there, and the standard modules only those bring (each a few ms)
WARM_BUNDLE_DOES_WITHOUT = frozenset({
    "requests", "urllib3", "ocistage.bundler.registry.client",
    "ocistage.bundler.registry.credentials",
    "ocistage.bundler.trust.gpg", "ocistage.bundler.trust.simplesign",
    "ocistage.bundler.trust.lookaside", "ocistage.bundler.trust.kept",
    "ocistage.bundler.trust.registriesd",
    "ocistage.bundler.runtime_config", "ocistage.bundler.rootfsmounts",
    "ocistage.runtimes.rootless", "ocistage.runtimes.userdb", "ocistage.stagers.mountrule",
    "ocistage.bundler.unpack.decompress", "tarfile", "zstandard", "isal",
    "ocistage.cache.filehandles", "concurrent.futures", "tempfile", "socket",
    "jsonschema", "rich",
})


def test_a_warm_bundle_loads_only_what_finding_it_needs(tmp_path: Path) -> None:
    """The second ``bundle --json --pull missing REF`` finds its bundle in the cache; under a
    policy file (accept anything: evaluated, no signature asked) it loads none of
    :data:`WARM_BUNDLE_DOES_WITHOUT`, while the first, which made the bundle, loaded the
    config writer (the probe sees lazy imports)."""
    from tests.bundler.tarbuilder import build_tar, file, write_oci_layout

    write_oci_layout(tmp_path / "layout", [build_tar([file("hello.txt", b"hello")])],
                     tag="v1", kind="gzip")
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    argv = ["bundle", "--json", "--pull", "missing", "--policy", str(policy), "--cmd", "true",
            f"oci:{tmp_path / 'layout'}:v1"]
    cold = _modules_after(argv, tmp_path)
    [made] = (tmp_path / "cache" / "bundles").iterdir()
    assert (made / "config.json").is_file()
    assert {"ocistage.bundler.runtime_config", "ocistage.bundler.trust.evaluate"} <= cold
    warm = _modules_after(argv, tmp_path)
    assert {"ocistage.bundler.flows.bundle", "ocistage.bundler.trust.evaluate"} <= warm
    assert sorted(WARM_BUNDLE_DOES_WITHOUT & warm) == []
    assert list((tmp_path / "cache" / "bundles").iterdir()) == [made]

# the modules that define commands: a command line loads the one of its command only
COMMAND_MODULES = frozenset({"ocistage.bundler.cli.image", "ocistage.bundler.cli.stage",
                             "ocistage.bundler.cli.slurm",
                             "ocistage.bundler.cli.cache", "ocistage.bundler.cli.config",
                             "ocistage.bundler.cli.doctor"})


@pytest.mark.parametrize(("argv", "wanted"), [
    (["--version"], set()),
    (["--help"], set()),
    ([], set()),
    (["bundle", "--help"], {"ocistage.bundler.cli.image"}),
    (["cache", "ls", "--help"], {"ocistage.bundler.cli.cache"}),
    (["scrun", "stage-in", "--help"], {"ocistage.bundler.cli.slurm"}),
    (["stage", "--help"], {"ocistage.bundler.cli.stage"}),
])
def test_a_command_line_loads_its_own_command_module_only(argv: list[str], wanted: set[str],
                                                         tmp_path: Path) -> None:
    loaded = _modules_after(argv, tmp_path)
    assert "ocistage.bundler.cli.app" in loaded
    assert COMMAND_MODULES & loaded == wanted


def test_version_and_routine_output_load_no_rich(tmp_path: Path) -> None:
    """rich (~20 ms) is for tables, progress bars and colored errors: ``--version``, a piped
    bundle, stage and unstage print plain lines (ocistage.bundler.cli.common.echo)."""
    from tests.bundler.tarbuilder import build_tar, file, write_oci_layout

    write_oci_layout(tmp_path / "layout", [build_tar([file("hello.txt", b"hello")])],
                     tag="v1", kind="gzip")
    bundle = ["bundle", "--cmd", "true", f"oci:{tmp_path / 'layout'}:v1"]
    stage = ["stage", str(tmp_path / "dest"), "--to", str(tmp_path / "staged")]
    for argv in (["--version"], bundle, bundle, [*bundle, str(tmp_path / "dest")], stage,
                 stage, ["unstage", str(tmp_path / "staged" / "dest")]):
        loaded = _modules_after(argv, tmp_path)
        assert sorted(m for m in loaded if m == "rich" or m.startswith("rich.")) == [], argv
    assert len(list((tmp_path / "cache" / "bundles").iterdir())) == 1
    assert (tmp_path / "dest" / "config.json").is_file()
    assert not (tmp_path / "staged" / "dest").exists()  # staged twice, then unstaged
