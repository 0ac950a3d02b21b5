"""The floor a cold bundle is compared with: the same layers fetched and unpacked by C tools.

Two pipelines per layer, the layers applied in order into one directory:

- ``floor`` (issue 29.4: the floor does the same work as a cold bundle, which keeps the blobs
  it fetched and verifies them)::

      curl -sf BLOB | tee blob | tee >(sha256sum) | DECOMP -dc | tee >(sha256sum) | tar -x

  The blob is kept beside the tree (on the same filesystem, as ocistage keeps it in its
  cache), and both digests are checked against the layer's digest and its diff_id: a mismatch
  raises :class:`FloorMismatch`, which ends the run. The two ``>(sha256sum)`` are named pipes
  read by two ``sha256sum`` processes of the same shell: a process substitution inside a
  pipeline element belongs to that element's subshell, which does not wait for it, so the
  shell could not know when the digests are complete (nor would ``wait4`` count them).
- ``floor-nv``: ``curl -sf BLOB | DECOMP -dc | tar -x``, the floor of the results before issue
  29 (nothing kept, nothing verified), kept so earlier numbers stay comparable.

``DECOMP`` is ``gzip -dc`` or ``zstd -dc --long=31``. Each pipeline is one ``bash`` process
timed by :func:`bench.bundle.run_timed` (its ``wait4`` peak RSS covers every stage).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DECOMPRESS = {"gzip": "gzip -dc", "zstd": "zstd -dc --long=31"}

# $1 URL, $2 scratch directory (blob, fifos, digests), $3 target, $4 decompressor
VERIFYING = r"""
set -o pipefail
url=$1 scratch=$2 target=$3 decompress=$4
mkfifo "$scratch/c.fifo" "$scratch/u.fifo"
sha256sum < "$scratch/c.fifo" > "$scratch/c.sum" & c=$!
sha256sum < "$scratch/u.fifo" > "$scratch/u.sum" & u=$!
curl -sf "$url" | tee "$scratch/blob" | tee "$scratch/c.fifo" | $decompress \
    | tee "$scratch/u.fifo" | tar -x --no-same-owner -C "$target"
status=$?
wait "$c" "$u" || status=1
exit "$status"
"""

NON_VERIFYING = r"""
set -o pipefail
curl -sf "$1" | $4 | tar -x --no-same-owner -C "$3"
"""

Timer = Callable[[list[str], bool], tuple[float, int]]


class FloorMismatch(Exception):
    """A digest of the verifying floor differs from the image's: the run is wrong, not slow."""


def layer_argv(url: str, scratch: Path, target: Path, compression: str,
               verify: bool) -> list[str]:
    """The ``bash -c`` command line of one layer's pipeline."""
    script = VERIFYING if verify else NON_VERIFYING
    return ["bash", "-c", script, "floor", url, str(scratch), str(target),
            DECOMPRESS[compression]]


def _read_sum(path: Path) -> str:
    text = path.read_text().split()
    return "sha256:" + (text[0] if text else "")


def check_digests(scratch: Path, digest: str, diff_id: str) -> None:
    """The blob's and the uncompressed stream's SHA-256 against the layer digest and diff_id."""
    for name, want in (("c.sum", digest), ("u.sum", diff_id)):
        got = _read_sum(scratch / name)
        if got != want:
            raise FloorMismatch(f"floor: {name[0]} digest {got} is not {want} "
                                f"({shlex.quote(str(scratch))})")


@dataclass(frozen=True)
class FloorLayer:
    url: str
    compression: str
    digest: str
    diff_id: str


def run_layers(layers: list[FloorLayer], target: Path, scratch_root: Path, verify: bool,
               timed: Timer) -> tuple[float, int]:
    """Apply ``layers`` in order into ``target``; (summed seconds, peak RSS KiB).
    ``timed(argv, first)`` runs one pipeline (``first``: the first layer of the run)."""
    target.mkdir()
    total, peak = 0.0, 0
    for number, layer in enumerate(layers):
        scratch = scratch_root / f"layer-{number}"
        scratch.mkdir(parents=True)
        argv = layer_argv(layer.url, scratch, target, layer.compression, verify)
        seconds, rss = timed(argv, number == 0)
        total += seconds
        peak = max(peak, rss)
        if verify:
            check_digests(scratch, layer.digest, layer.diff_id)
    return total, peak


def zstd_window(blob: Path) -> int:
    """The window size (bytes) the first zstd frame of ``blob`` declares: what a decompressor
    must hold (RFC 8878 3.1.1.1.2; a single-segment frame's window is its content size)."""
    with open(blob, "rb") as file:
        head = file.read(14)
    if len(head) < 6 or head[:4] != b"\x28\xb5\x2f\xfd":
        raise ValueError(f"{blob}: not a zstd frame")
    descriptor = head[4]
    if not descriptor & 0x20:  # not single segment: a window descriptor follows
        exponent, mantissa = head[5] >> 3, head[5] & 7
        base = 1 << (10 + exponent)
        return base + (base // 8) * mantissa
    dict_id_bytes = (0, 1, 2, 4)[descriptor & 3]
    size_bytes = (1, 2, 4, 8)[descriptor >> 6]
    start = 5 + dict_id_bytes
    size = int.from_bytes(head[start:start + size_bytes], "little")
    return size + 256 if size_bytes == 2 else size
