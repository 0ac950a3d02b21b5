#!/usr/bin/env bash
# Build a SchedMD Slurm release (with scrun) for the three-node end-to-end clusters, once per
# machine: the prefix is keyed by the tarball's sha256, so this rebuilds only when that prefix
# is missing (or incomplete: it is published by renaming a finished build into place).
#
#   .ci/build-slurm.sh [VERSION]  build VERSION (24.05.8, the default, or 26.05.3) into
#                                 /opt/ocistage-slurm/<first 16 hex of the tarball's sha256>
#   OCISTAGE_SLURM_PREFIX_ROOT=D  ... into D/<hash prefix> instead
#   OCISTAGE_SLURM_TARBALL=F      the tarball (default: ../shared/vendor/slurm-VERSION.tar.xz
#                                 beside the repository, or beside the main checkout of a
#                                 git worktree)
#   OCISTAGE_SLURM_JOBS=N         make -jN (default: nproc)
#
# Prints the prefix on its last line. Needs the build dependencies listed in .ci/run
# (libmunge-dev, liblua5.3-dev, libjson-c-dev, libyaml-dev, libhttp-parser-dev, libpmix-dev,
# ...); scrun is only built when Lua 5.3, json-c, yaml and http-parser are found, and this
# fails if it is not. 26.05.3 is built with PMIx (Debian's libpmix-dev) for `srun --mpi=pmix`;
# 24.05.8 keeps the build it always had (its prefix is keyed by the tarball alone).
set -euo pipefail
exec </dev/null

VERSION="${1:-24.05.8}"
case "$VERSION" in
    24.05.8) SHA256=b1b1549ee80fbcd2e4a3b40f17b0e794f92893b6e059d32d964d8db92c399b0e
             EXTRA_CONFIGURE=() ;;
    26.05.3) SHA256=b7c7c7c8d78f7fde485ac7fc811034c5dd1a067d0167dba1a044e731c0374b13
             EXTRA_CONFIGURE=(--with-pmix="$(dirname "$(dpkg -L libpmix-dev 2>/dev/null \
                 | grep -m1 '/pmix2/include$' || echo /usr/lib/x86_64-linux-gnu/pmix2/include)")") ;;
    *) printf 'build-slurm.sh: unknown version %s (24.05.8 or 26.05.3)\n' "$VERSION" >&2; exit 2 ;;
esac

REPO="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
TARBALL_NAME="vendor/slurm-$VERSION.tar.xz"
TARBALL="${OCISTAGE_SLURM_TARBALL:-$REPO/../shared/$TARBALL_NAME}"
if [ -z "${OCISTAGE_SLURM_TARBALL:-}" ] && [ ! -f "$TARBALL" ]; then
    # a git worktree elsewhere: shared/ is beside the main checkout
    common="$(git -C "$REPO" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
    if [ -n "$common" ] && [ -f "$common/../../shared/$TARBALL_NAME" ]; then
        TARBALL="$common/../../shared/$TARBALL_NAME"
    fi
fi
ROOT="${OCISTAGE_SLURM_PREFIX_ROOT:-/opt/ocistage-slurm}"
PREFIX="$ROOT/${SHA256:0:16}"
JOBS="${OCISTAGE_SLURM_JOBS:-$(nproc)}"

die() { printf 'build-slurm.sh: %s\n' "$*" >&2; exit 1; }

if [ -x "$PREFIX/bin/scrun" ] && [ -x "$PREFIX/sbin/slurmctld" ] && [ -f "$PREFIX/.built" ]; then
    echo "Slurm already built in $PREFIX"
    echo "$PREFIX"
    exit 0
fi

[ -f "$TARBALL" ] || die "no tarball at $TARBALL"
got="$(sha256sum "$TARBALL" | cut -d' ' -f1)"
[ "$got" = "$SHA256" ] || die "$TARBALL has sha256 $got, expected $SHA256"

mkdir -p "$ROOT"
# The build's --prefix is the final path (Slurm compiles it in), so build and install into it
# under a lock, with a marker written last; an interrupted build is removed and redone.
exec 9>"$ROOT/.lock"
flock 9
if [ -f "$PREFIX/.built" ]; then
    echo "$PREFIX"
    exit 0
fi
rm -rf "$PREFIX"
WORK="$(mktemp -d "$ROOT/.build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
tar -xJf "$TARBALL" -C "$WORK"
src="$(find "$WORK" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
cd "$src"
./configure --prefix="$PREFIX" --sysconfdir="$PREFIX/etc" --enable-multiple-slurmd \
    "${EXTRA_CONFIGURE[@]}" >"$WORK/configure.log" 2>&1 \
    || { tail -n 40 "$WORK/configure.log" >&2; die "configure failed"; }
make -j"$JOBS" >"$WORK/make.log" 2>&1 || { tail -n 60 "$WORK/make.log" >&2; die "make failed"; }
make install >"$WORK/install.log" 2>&1 || { tail -n 40 "$WORK/install.log" >&2; die "make install failed"; }
[ -x "$PREFIX/bin/scrun" ] || die "scrun was not built (Lua 5.3, json-c, yaml or http-parser missing?)"
"$PREFIX/sbin/slurmctld" -V
printf '%s\n' "$SHA256" >"$PREFIX/.built"
echo "$PREFIX"
