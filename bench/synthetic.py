"""Synthetic scale images: N files and B bytes in several layers, made from a seed.

The images of :mod:`bench.images` are slices of this machine's ``/usr`` (at most ~1 GB); the
scale benchmark (``python -m bench scale``, :mod:`bench.scale`) needs up to ~10 GB and 300k
files, so these are generated instead, reproducibly (the same seed gives the same tar bytes and
the same digests on any machine with the same Python):

- file sizes are log-normal, scaled so that they sum to the requested bytes (one file at most
  64 MiB); half of the files are pseudo-random bytes (incompressible, ``random.randbytes``), the
  other half slices of a pseudo-text made of a small vocabulary (compressible ~4x by gzip and far
  more by a long-window zstd, which finds the repeats);
- files sit in ``data/dNNN/dNN/`` directories of ~100 files, with a symlink every 50 files; the
  entries are split over ``layers`` layers (50/25/15/10% of the files for four), each layer
  repeating the directories its files need, as image builders do;
- one pass writes the tar (PAX format, root-owned, a fixed mtime), hashes it (the diff_id) and
  feeds it to one compressor per requested compression: ``gzip -6`` (the default of image
  builders) and ``zstd -3 --long=27`` (a 128 MiB window: what a decompressor has to hold).

Images are cached in ``$OCISTAGE_BENCH_CACHE/scale-v1/`` (``~/.cache/ocistage-bench``) as one
OCI layout and reused; ``images.json`` there describes them.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bench.images import MB, BuiltImage, _Layout, add_image, cache_root, read_built

GENERATOR_VERSION = 1
MAX_FILE = 64 * MB
LAYER_SHARES = {1: (1.0,), 2: (0.6, 0.4), 3: (0.5, 0.3, 0.2), 4: (0.5, 0.25, 0.15, 0.10)}
MTIME = 1_700_000_000
COMPRESSORS = {"gzip": ["gzip", "-6", "-n", "-c"],
               "zstd": ["zstd", "-3", "--long=27", "-q", "-c", "-T1"]}
WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed",
         "do", "eiusmod", "tempor", "incididunt", "ut", "labore", "et", "dolore", "magna",
         "aliqua", "usr", "lib", "share", "doc", "include", "bin", "config", "module", "python",
         "package", "library", "install", "version", "license", "copyright")


@dataclass(frozen=True)
class SynthSpec:
    """``files`` regular files (plus their directories and symlinks) of ``size`` bytes."""

    files: int
    size: int
    layers: int = 4
    seed: int = 16

    @property
    def name(self) -> str:
        return f"scale-{self.files}f-{self.size // MB}m"


def _file_sizes(spec: SynthSpec, rng: random.Random) -> list[int]:
    raw = [rng.lognormvariate(0.0, 1.6) for _ in range(spec.files)]
    scale = spec.size / sum(raw)
    sizes = [min(MAX_FILE, int(value * scale)) for value in raw]
    # what the cap cut off goes to the smallest files, so the total stays as asked
    short = spec.size - sum(sizes)
    index = 0
    while short > 0 and spec.files:
        add = min(short, MAX_FILE - sizes[index % spec.files], max(1, short // spec.files + 1))
        sizes[index % spec.files] += add
        short -= add
        index += 1
    return sizes


def _text_pool(rng: random.Random, size: int = 4 * MB) -> bytes:
    out = io.StringIO()
    written = 0
    while written < size:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) + "\n"
        out.write(line)
        written += len(line)
    return out.getvalue().encode()[:size]


class _Tee(io.RawIOBase):
    """Hash what tarfile writes (the diff_id) and send it to every compressor."""

    def __init__(self, sinks: list[IO[bytes]]) -> None:
        self.digest = hashlib.sha256()
        self.sinks = sinks

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.digest.update(data)
        for sink in self.sinks:
            sink.write(data)
        return len(data)


def _write_layer(tar: tarfile.TarFile, entries: range, sizes: list[int],
                 rng: random.Random, text: bytes) -> int:
    """Write files ``entries`` (global indices) with their directories; return entry count."""
    made: set[str] = set()
    count = 0
    for index in entries:
        top, sub = f"data/d{index // 10_000:03d}", f"d{index // 100 % 100:02d}"
        for directory in (top, f"{top}/{sub}"):
            if directory not in made:
                made.add(directory)
                info = tarfile.TarInfo(directory)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, MTIME
                tar.addfile(info)
                count += 1
        size = sizes[index]
        if rng.random() < 0.5:
            data = rng.randbytes(size)
        else:
            start = rng.randrange(len(text) // 2)  # text is the pool twice: no wrap-around
            if size <= len(text) - start:
                data = text[start:start + size]
            else:
                data = (text * (size // len(text) + 1))[:size]
        info = tarfile.TarInfo(f"{top}/{sub}/f{index:07d}.bin")
        info.size, info.mode, info.mtime = size, 0o644, MTIME
        tar.addfile(info, io.BytesIO(data))
        count += 1
        if index % 50 == 49:
            link = tarfile.TarInfo(f"{top}/{sub}/l{index:07d}")
            link.type, link.linkname, link.mtime = tarfile.SYMTYPE, f"f{index:07d}.bin", MTIME
            link.mode = 0o777
            tar.addfile(link)
            count += 1
    return count


def _build(spec: SynthSpec, compressions: tuple[str, ...], layout: _Layout,
           work: Path) -> dict[str, BuiltImage]:
    rng = random.Random(spec.seed)
    sizes = _file_sizes(spec, rng)
    text = _text_pool(rng) * 2
    shares = LAYER_SHARES.get(spec.layers) or tuple([1 / spec.layers] * spec.layers)
    bounds = [0]
    for share in shares:
        bounds.append(min(spec.files, bounds[-1] + math.ceil(share * spec.files)))
    bounds[-1] = spec.files
    layers: dict[str, list[tuple[str, str, int, int]]] = {c: [] for c in compressions}
    entries_total = 0
    for number in range(len(shares)):
        outputs = {c: work / f"layer-{number}.{c}" for c in compressions}
        processes = []
        for compression, path in outputs.items():
            with open(path, "wb") as target:
                processes.append(subprocess.Popen(COMPRESSORS[compression],
                                                  stdin=subprocess.PIPE, stdout=target))
        tee = _Tee([p.stdin for p in processes if p.stdin])
        with (io.BufferedWriter(tee, buffer_size=MB) as buffered,
              tarfile.open(fileobj=buffered, mode="w|", format=tarfile.PAX_FORMAT,
                           bufsize=MB) as tar):
            entries_total += _write_layer(tar, range(bounds[number], bounds[number + 1]),
                                          sizes, rng, text)
        for process in processes:
            assert process.stdin is not None
            process.stdin.close()
            if process.wait() != 0:
                raise RuntimeError(f"{process.args!r} exited {process.returncode}")
        diff_id = "sha256:" + tee.digest.hexdigest()
        size = sum(sizes[bounds[number]:bounds[number + 1]])
        for compression, path in outputs.items():
            digest, packed = layout.add_file(path)
            layers[compression].append((digest, diff_id, size, packed))
    built = {}
    for compression, layer_list in layers.items():
        name = f"{spec.name}-{compression}"
        manifest_digest = add_image(
            layout, name, [(layer[0], layer[1], layer[3]) for layer in layer_list],
            compression, env_path="/usr/bin:/bin", cmd="/bin/true",
            history=f"ocistage bench synthetic {name}")
        built[compression] = BuiltImage(
            name, layout.path, manifest_digest,
            tuple((layer[0], compression) for layer in layer_list),
            tuple(layer[1] for layer in layer_list), entries_total,
            sum(layer[2] for layer in layer_list), sum(layer[3] for layer in layer_list))
    return built


def build_synthetic(spec: SynthSpec, compressions: tuple[str, ...],
                    root: Path | None = None) -> dict[str, BuiltImage]:
    """The image of ``spec`` in each compression, built once (one tar pass) and cached."""
    directory = (root or cache_root()) / f"scale-v{GENERATOR_VERSION}"
    described = directory / "images.json"
    known = read_built(described)
    missing = tuple(c for c in compressions if f"{spec.name}-{c}" not in known)
    if missing:
        directory.mkdir(parents=True, exist_ok=True)
        print(f"bench: generating {spec.name} ({', '.join(missing)}; once, cached in "
              f"{directory})", flush=True)
        with tempfile.TemporaryDirectory(dir=directory) as work:
            made = _build(spec, missing, _Layout(directory / "layout"), Path(work))
        # read again: another run may have added images meanwhile
        current = json.loads(described.read_text()) if described.is_file() else {}
        for image in made.values():
            known[image.name] = image
            current[image.name] = {**vars(image), "layout": str(image.layout)}
        partial = described.with_suffix(".partial")
        partial.write_text(json.dumps(current, indent=2))
        os.replace(partial, described)
    return {c: known[f"{spec.name}-{c}"] for c in compressions}
