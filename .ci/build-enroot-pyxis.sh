#!/usr/bin/env bash
# Build NVIDIA's enroot 4.1.2 and pyxis 0.24.0 for the pyxis end-to-end tests
# (tests/e2e/test_pyxis_importer.py, docs/pyxis.md), once per machine: the prefix is keyed by the
# sha256 of the five tarballs and of the Slurm prefix pyxis is compiled against, so this rebuilds
# only when that prefix is missing (or incomplete: it is published by renaming a finished build
# into place).
#
#   .ci/build-enroot-pyxis.sh SLURM_PREFIX   build into /opt/ocistage-enroot-pyxis/<16 hex>,
#                                        pyxis against the Slurm installed in SLURM_PREFIX (a
#                                        SPANK plugin loads only into the release whose headers
#                                        built it: name the Slurm your slurmd runs; the script
#                                        says which release it found there)
#   OCISTAGE_SLURM_PREFIX=P              the same, when no argument is given
#   OCISTAGE_ENROOT_PYXIS_PREFIX_ROOT=D  ... into D/<16 hex> instead
#   OCISTAGE_VENDOR=D                    the tarballs (default: ../shared/vendor beside the
#                                        repository, or beside the main checkout of a worktree)
#   OCISTAGE_ENROOT_JOBS=N               make -jN for enroot (default: 2)
#
# As enroot's own `make setcap` does, enroot-mksquashovlfs gets cap_sys_admin and
# enroot-aufs2ovlfs cap_sys_admin,cap_mknod (setcap from libcap2-bin, as root): without them
# `enroot import` fails for every user but root. A site installing enroot does the same
# (docs/pyxis.md).
#
# Layout of the prefix: enroot's `make install prefix=<prefix>/enroot` (bin/enroot, lib/enroot,
# etc/enroot) and pyxis's spank_pyxis.so in <prefix>/pyxis/. Prints the prefix on its last line.
# Needs build-essential plus libmd-dev, gawk and parallel (enroot's build and its runtime also
# want squashfuse, fuse-overlayfs and pigz; listed in .ci/run).
set -euo pipefail
exec </dev/null

REPO="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
VENDOR="${OCISTAGE_VENDOR:-$REPO/../shared/vendor}"
if [ -z "${OCISTAGE_VENDOR:-}" ] && [ ! -d "$VENDOR" ]; then
    common="$(git -C "$REPO" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
    if [ -n "$common" ] && [ -d "$common/../../shared/vendor" ]; then
        VENDOR="$(cd "$common/../../shared/vendor" && pwd)"
    fi
fi
# name sha256, as in ../shared/vendor/SHA256SUMS (checked here, not read from there)
TARBALLS=(
    "enroot-4.1.2.tar.xz 060529a268176a58e51834ffd733739ffc23ca86bea6d4f6eab65cfaad7b3d99"
    "enroot-dep-linux-headers.tar.xz 844b0eee047c5eb63565f7d49f5403d9c1eeaf8c318deee244da5691487827af"
    "enroot-dep-makeself.tar.xz 666ea6fc35eb6c69033f71a8043096842526fd1be33453b762c4a0fbe6c09bbd"
    "enroot-dep-musl.tar.xz f1a7c64edd0c17ab5f393ee58ebda2b5a1a9ca9295e60039d56c6992cf0a61e8"
    "pyxis-0.24.0.tar.xz 10f4999ae3578b856531c812d1b800a104dd9fbb04e72c73699fc1d59a1f1b75"
)
SLURM_PREFIX="${1:-${OCISTAGE_SLURM_PREFIX:-}}"
ROOT="${OCISTAGE_ENROOT_PYXIS_PREFIX_ROOT:-/opt/ocistage-enroot-pyxis}"
JOBS="${OCISTAGE_ENROOT_JOBS:-2}"

die() { printf 'build-enroot-pyxis.sh: %s\n' "$*" >&2; exit 1; }

[ -n "$SLURM_PREFIX" ] || die "name the Slurm prefix pyxis is built against: .ci/build-enroot-pyxis.sh SLURM_PREFIX (the Slurm your slurmd runs; .ci/build-slurm.sh prints its prefix)"
VERSION_H="$SLURM_PREFIX/include/slurm/slurm_version.h"
[ -f "$VERSION_H" ] || die "no Slurm headers in $SLURM_PREFIX/include (run .ci/build-slurm.sh, or name the prefix of an installed Slurm with its headers)"
# SLURM_VERSION_NUMBER 0x180508 is 24.05.8
number="$(sed -n 's/^#define SLURM_VERSION_NUMBER 0x\([0-9a-fA-F]*\).*/\1/p' "$VERSION_H")"
[ -n "$number" ] || die "$VERSION_H has no SLURM_VERSION_NUMBER"
number=$((16#$number))
SLURM_VERSION="$(printf '%d.%02d.%d' $((number >> 16 & 255)) $((number >> 8 & 255)) $((number & 255)))"
echo "building pyxis against Slurm $SLURM_VERSION in $SLURM_PREFIX" >&2
command -v setcap >/dev/null || die "setcap is missing (Debian: apt-get install libcap2-bin): enroot needs its capabilities"

KEY="$(printf '%s\n' "${TARBALLS[@]}" "slurm=$SLURM_PREFIX" "setcap=1" | sha256sum | cut -c1-16)"
PREFIX="$ROOT/$KEY"

if [ -f "$PREFIX/.built" ] && [ -x "$PREFIX/enroot/bin/enroot" ] && [ -f "$PREFIX/pyxis/spank_pyxis.so" ]; then
    echo "enroot and pyxis already built in $PREFIX"
    echo "$PREFIX"
    exit 0
fi

[ -f "$SLURM_PREFIX/include/slurm/spank.h" ] || die "no spank.h in $SLURM_PREFIX/include/slurm"
for entry in "${TARBALLS[@]}"; do
    name="${entry%% *}" want="${entry##* }"
    [ -f "$VENDOR/$name" ] || die "no tarball at $VENDOR/$name"
    got="$(sha256sum "$VENDOR/$name" | cut -d' ' -f1)"
    [ "$got" = "$want" ] || die "$VENDOR/$name has sha256 $got, expected $want"
done

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock"
flock 9
if [ -f "$PREFIX/.built" ]; then
    echo "$PREFIX"
    exit 0
fi
# enroot compiles its prefix into its scripts (sysconfdir, libdir): install with DESTDIR into a
# staging tree under the lock and rename the finished prefix into place, marker included; an
# interrupted build leaves only its .build.* directory, removed here and by the next run.
rm -rf "$PREFIX" "$ROOT"/.build.*
WORK="$(mktemp -d "$ROOT/.build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
STAGE="$WORK/stage$PREFIX"

tar -xJf "$VENDOR/enroot-4.1.2.tar.xz" -C "$WORK"
for dep in linux-headers makeself musl; do
    tar -xJf "$VENDOR/enroot-dep-$dep.tar.xz" -C "$WORK/enroot-4.1.2/deps"
done
tar -xJf "$VENDOR/pyxis-0.24.0.tar.xz" -C "$WORK"

# enroot's bundled musl (FORCE_GLIBC fails on Debian 12); `make deps` tries a git submodule
# update first and ignores its failure
make -C "$WORK/enroot-4.1.2" -j"$JOBS" install prefix="$PREFIX/enroot" DESTDIR="$WORK/stage" >"$WORK/enroot.log" 2>&1 \
    || { tail -n 60 "$WORK/enroot.log" >&2; die "enroot make install failed"; }
[ -x "$STAGE/enroot/bin/enroot" ] || die "enroot was not installed into $STAGE/enroot"
# enroot's Makefile writes $(DESTDIR) into bin/enroot and enroot.conf (its libdir and
# sysconfdir): those are text files; make them name the final prefix, and check that no other
# file holds the staging path
grep -rlI -F "$WORK/stage" "$STAGE" | while IFS= read -r file; do
    sed -i "s|$WORK/stage||g" "$file"
done
if grep -rl -F "$WORK/stage" "$STAGE" >&2; then die "the files above name the staging directory"; fi

CPPFLAGS="-I$SLURM_PREFIX/include" make -C "$WORK/pyxis-0.24.0" >"$WORK/pyxis.log" 2>&1 \
    || { tail -n 40 "$WORK/pyxis.log" >&2; die "pyxis make failed"; }
install -D -m 0755 "$WORK/pyxis-0.24.0/spank_pyxis.so" "$STAGE/pyxis/spank_pyxis.so"
printf '%s\n' "$SLURM_VERSION" >"$STAGE/pyxis/slurm-version"
# enroot's `make setcap`, on the installed helpers (the rename below keeps them: same filesystem)
setcap cap_sys_admin+pe "$STAGE/enroot/bin/enroot-mksquashovlfs"
setcap cap_sys_admin,cap_mknod+pe "$STAGE/enroot/bin/enroot-aufs2ovlfs"

chmod 0755 "$STAGE"
mv -T "$STAGE" "$PREFIX"
# enroot runs only from its final prefix: check it there, then mark the prefix complete
"$PREFIX/enroot/bin/enroot" version || { rm -rf "$PREFIX"; die "the installed enroot does not run"; }
printf '%s\n' "$KEY" >"$PREFIX/.built"
echo "$PREFIX"
