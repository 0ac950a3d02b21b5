#!/bin/bash
# Install ocistage for every user of a site under one PREFIX (docs/site.md), or remove it.
#
#   scripts/site-install.sh [--wheelhouse DIR] [--wheel FILE] PREFIX
#   scripts/site-install.sh --uninstall PREFIX
#
# `make site-install PREFIX=... [WHEELHOUSE=DIR]` and `make site-uninstall PREFIX=...` call it.
#
# --wheelhouse DIR  install offline: `pip install --no-index --find-links DIR`; DIR holds the
#                   ocistage wheel and every wheel it needs (`make site-wheelhouse` on a machine
#                   with the internet makes it)
# --wheel FILE      the ocistage wheel to install (default: the newest in DIR); without
#                   --wheelhouse its dependencies come from the package index
#
# What it writes, all under PREFIX (nothing elsewhere: no /etc, no apt-get):
#   venvs/<stamp>/                        the virtual environment, made with /usr/bin/python3
#   venv -> venvs/<stamp>                 switched by one rename() on an upgrade
#   bin/ocistage, bin/ocistage-pyxis-importer -> ../venv/bin/...
#   share/man/man1/ocistage.1, ocistage-pyxis-importer.1
#   share/bash-completion/completions/ocistage
#   modulefiles/ocistage/VERSION (Environment Modules, Tcl), VERSION.lua (Lmod)
#   share/ocistage/site-install           what was installed, for upgrades and --uninstall
# Everything readable by every user (directories 0755, files 0644 or 0755) whatever the umask.
# Run again, it builds a new venv beside the current one and switches to it; the venv it
# replaces is kept until the next run (processes started from it may still load modules from
# it), older ones are removed. --uninstall removes exactly these; the users' caches stay.
set -euo pipefail
umask 022

PYTHON=${OCISTAGE_SITE_PYTHON:-/usr/bin/python3}
RECORD_NAME=share/ocistage/site-install

die() { printf 'site-install: error: %s\n' "$*" >&2; exit 1; }
usage() {
    sed -n '3,5p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

wheelhouse= wheel= uninstall=0 prefix=
while [ $# -gt 0 ]; do
    case $1 in
        --wheelhouse) [ $# -ge 2 ] || usage; wheelhouse=$2; shift 2 ;;
        --wheel) [ $# -ge 2 ] || usage; wheel=$2; shift 2 ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) usage ;;
        --) shift; break ;;
        -*) printf 'site-install: unknown option %s\n' "$1" >&2; usage ;;
        *) [ -z "$prefix" ] || usage; prefix=$1; shift ;;
    esac
done
if [ $# -gt 0 ]; then [ -z "$prefix" ] && [ $# -eq 1 ] || usage; prefix=$1; fi
[ -n "$prefix" ] || usage

# PREFIX ends up in a plugstack.conf line (split at white space), in Tcl and Lua modulefiles,
# in PATH and MANPATH (split at ':') and in shebangs: only characters all of them carry as they
# are. It is never printed back in an error: it may hold anything.
case $prefix in
    /*) ;;
    *) die "PREFIX must be an absolute path" ;;
esac
if [[ ! $prefix =~ ^[A-Za-z0-9/._+@,=-]+$ ]]; then
    die "PREFIX may hold only letters, digits and / . _ + @ , = - (it is written into" \
        "plugstack.conf, modulefiles, PATH and scripts as it is)"
fi
prefix=${prefix%/}
[ -n "$prefix" ] || die "PREFIX must not be /"
case $prefix/ in
    */../*|*/./*|*//*) die "PREFIX must not contain . or .. components or //: $prefix" ;;
esac

record=$prefix/$RECORD_NAME
venv_link=$prefix/venv
bins=(ocistage ocistage-pyxis-importer)
mans=(share/man/man1/ocistage.1 share/man/man1/ocistage-pyxis-importer.1)
completion=share/bash-completion/completions/ocistage

# the value of KEY in the record of a previous install ("" when there is none)
recorded() {
    [ -f "$record" ] || return 0
    sed -n "s/^$1=//p" "$record" | head -n 1
}

# rmdir the directories on the way from DIR up to PREFIX (PREFIX too) that are empty
prune_up() {
    local dir=$1
    while :; do
        rmdir -- "$dir" 2>/dev/null || return 0
        [ "$dir" != "$prefix" ] || return 0
        dir=${dir%/*}
    done
}

check_version() {
    [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9.+_-]*$ ]] || die "unexpected version string: $1"
}

remove_modulefiles() {  # VERSION
    check_version "$1"
    rm -f -- "$prefix/modulefiles/ocistage/$1" "$prefix/modulefiles/ocistage/$1.lua"
}

uninstall() {
    [ -f "$record" ] || die "no site install in $prefix (no $record)"
    local version current name
    version=$(recorded version)
    current=$(recorded venv)
    [ -n "$version" ] && [ -n "$current" ] || die "$record lacks version= or venv="
    remove_modulefiles "$version"
    for name in "${bins[@]}"; do
        # only the links this script made
        if [ -L "$prefix/bin/$name" ] && [ "$(readlink -- "$prefix/bin/$name")" = "../venv/bin/$name" ]; then
            rm -f -- "$prefix/bin/$name"
        fi
    done
    for name in "${mans[@]}" "$completion"; do rm -f -- "${prefix:?}/$name"; done
    if [ -L "$venv_link" ]; then rm -f -- "$venv_link"; fi
    for name in "$prefix"/venvs/*; do
        [ -e "$name" ] || continue
        # only venvs this script made (a name it chose, a venv inside)
        if [[ ${name##*/} =~ ^[0-9]{8}T[0-9]{6}-[0-9]+$ ]] && [ -f "$name/pyvenv.cfg" ]; then
            rm -rf -- "$name"
        fi
    done
    rm -f -- "$record"
    for name in bin share/man/man1 share/bash-completion/completions share/ocistage \
                modulefiles/ocistage venvs; do
        prune_up "$prefix/$name"
    done
    printf 'removed ocistage %s from %s\n' "$version" "$prefix"
}

if [ "$uninstall" -eq 1 ]; then
    [ -z "$wheelhouse" ] && [ -z "$wheel" ] || usage
    uninstall
    exit 0
fi

# --- install ---------------------------------------------------------------------------------
[ -x "$PYTHON" ] || die "$PYTHON not found (Debian: apt-get install python3 python3-venv)"
pip_source=()
if [ -n "$wheelhouse" ]; then
    [ -d "$wheelhouse" ] || die "wheelhouse $wheelhouse is not a directory"
    wheelhouse=$(cd -- "$wheelhouse" && pwd)
    pip_source=(--no-index --find-links "$wheelhouse")
    if [ -z "$wheel" ]; then
        wheel=$(find "$wheelhouse" -maxdepth 1 -name 'ocistage-*-py3-none-any.whl' -printf '%f\n' \
                | sort -V | tail -n 1)
        [ -n "$wheel" ] || die "no ocistage-*.whl in $wheelhouse (make site-wheelhouse makes one)"
        wheel=$wheelhouse/$wheel
    fi
fi
[ -n "$wheel" ] || die "no wheel given: --wheel FILE or --wheelhouse DIR (make site-install builds one)"
[ -f "$wheel" ] || die "wheel $wheel not found"
case $wheel in /*) ;; *) wheel=$PWD/$wheel ;; esac

if [ -e "$venv_link" ] && [ ! -L "$venv_link" ]; then
    die "$venv_link exists and is not the link this script makes: move it away first"
fi

for name in "${bins[@]}"; do
    if [ -e "$prefix/bin/$name" ] || [ -L "$prefix/bin/$name" ]; then
        [ -L "$prefix/bin/$name" ] && [ "$(readlink -- "$prefix/bin/$name")" = "../venv/bin/$name" ] \
            || die "$prefix/bin/$name exists and is not the link this script makes: move it away first"
    fi
done

mkdir -p -- "$prefix/venvs"
stamp=$(date -u +%Y%m%dT%H%M%S)-$$
new=$prefix/venvs/$stamp
staged=() switched=0
cleanup() {
    local status=$?
    if [ "$status" -ne 0 ]; then
        # once PREFIX/venv names it, the new venv is the one in use: it stays
        [ "$switched" -eq 1 ] || rm -rf -- "$new"
        local file
        for file in "${staged[@]}"; do rm -f -- "$file"; done
        rm -f -- "$prefix/.venv.new"
    fi
}
trap cleanup EXIT

printf 'making %s with %s -m venv\n' "$new" "$PYTHON"
"$PYTHON" -m venv "$new" || die "$PYTHON -m venv failed (Debian: apt-get install python3-venv)"
printf 'installing %s%s\n' "${wheel##*/}" "${wheelhouse:+ and what it needs from $wheelhouse (offline)}"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$new/bin/python" -m pip install -q --no-cache-dir \
    "${pip_source[@]}" "$wheel"
version=$("$new/bin/python" -c 'import ocistage; print(ocistage.__version__)')
check_version "$version"
chmod -R u+rwX,go+rX,go-w -- "$new"

# the files made from the new venv, each written beside its final name and renamed
install_file() {  # DEST MODE COMMAND...: COMMAND's stdout becomes DEST
    local dest=$1 mode=$2
    shift 2
    mkdir -p -- "${dest%/*}"
    "$@" > "$dest.new"
    chmod "$mode" -- "$dest.new"
    staged+=("$dest.new")
}

install_file "$prefix/${mans[0]}" 0644 "$new/bin/python" -m ocistage.bundler.cli.manpage
install_file "$prefix/${mans[1]}" 0644 "$new/bin/python" -m ocistage.bundler.pyxis.manpage
# typer prints the script for the shell it is given (without one it guesses from the parent)
install_file "$prefix/$completion" 0644 "$new/bin/ocistage" --show-completion bash

moddir=$prefix/modulefiles/ocistage
install_file "$moddir/$version" 0644 cat <<EOF
#%Module1.0
## ocistage $version, installed by ocistage's scripts/site-install.sh (docs/site.md)
proc ModulesHelp { } {
    puts stderr "ocistage $version: registry images -> rootless OCI bundles, staged for Slurm jobs"
    puts stderr "man ocistage; the pyxis importer: $prefix/bin/ocistage-pyxis-importer"
}
module-whatis "ocistage $version: registry images -> rootless OCI bundles for Slurm"
conflict ocistage
prepend-path PATH {$prefix/bin}
prepend-path MANPATH {$prefix/share/man}
# man-db reads an empty MANPATH element as its default path: keep the system's pages
append-path MANPATH {}
# bash completion: Environment Modules >= 4.6 has source-sh; Lmod reads VERSION.lua instead
# (its Tcl interpreter lacks source-sh)
if {[info commands source-sh] ne "" && [module-info shell] eq "bash"} {
    source-sh bash {$prefix/$completion}
}
EOF
install_file "$moddir/$version.lua" 0644 cat <<EOF
-- ocistage $version, installed by ocistage's scripts/site-install.sh (docs/site.md)
help([[ocistage $version: registry images -> rootless OCI bundles, staged for Slurm jobs
man ocistage; the pyxis importer: $prefix/bin/ocistage-pyxis-importer]])
whatis("Name: ocistage")
whatis("Version: $version")
whatis("Description: registry images -> rootless OCI bundles for Slurm")
conflict("ocistage")
prepend_path("PATH", "$prefix/bin")
prepend_path("MANPATH", "$prefix/share/man")
-- man-db reads an empty MANPATH element as its default path: keep the system's pages
append_path("MANPATH", "")
-- bash completion: Lmod records the function and the complete command the script defines
if myShellName() == "bash" then
    source_sh("bash", "$prefix/$completion")
end
EOF

# publish: the files first (they describe the new venv), then the venv link by one rename()
previous_version=$(recorded version)
previous_venv=$(recorded venv)
for file in "${staged[@]}"; do mv -f -- "$file" "${file%.new}"; done
staged=()
if [ -n "$previous_version" ] && [ "$previous_version" != "$version" ]; then
    remove_modulefiles "$previous_version"
fi
ln -s "venvs/$stamp" "$prefix/.venv.new"
mv -T -- "$prefix/.venv.new" "$venv_link"
switched=1
mkdir -p -- "$prefix/bin"
for name in "${bins[@]}"; do
    [ -L "$prefix/bin/$name" ] || ln -s "../venv/bin/$name" "$prefix/bin/$name"
done
mkdir -p -- "${record%/*}"
printf 'version=%s\nvenv=%s\n' "$version" "$stamp" > "$record.new"
chmod 0644 -- "$record.new"
mv -f -- "$record.new" "$record"
trap - EXIT

# the venv replaced now is kept (running processes); the ones before it go
for old in "$prefix"/venvs/*; do
    name=${old##*/}
    [ "$name" = "$stamp" ] || [ "$name" = "$previous_venv" ] && continue
    if [[ $name =~ ^[0-9]{8}T[0-9]{6}-[0-9]+$ ]] && [ -f "$old/pyvenv.cfg" ]; then
        rm -rf -- "$old"
    fi
done

# every directory on the way must let users through
dir=$prefix
while [ -n "$dir" ]; do
    if [ -d "$dir" ] && [ $(( 0$(stat -c %a -- "$dir") & 1 )) -eq 0 ]; then
        printf 'site-install: warning: %s is not searchable by other users (mode %s): they cannot run ocistage\n' \
            "$dir" "$(stat -c %a -- "$dir")" >&2
    fi
    dir=${dir%/*}
done

cat <<EOF
installed ocistage $version in $prefix
  commands     $prefix/bin/ocistage, $prefix/bin/ocistage-pyxis-importer
  man pages    $prefix/share/man/man1 (man -M $prefix/share/man ocistage)
  completion   $prefix/$completion
  modulefiles  $prefix/modulefiles (module use $prefix/modulefiles; module load ocistage/$version)

What the site may add outside $prefix (this script writes nothing there; docs/site.md):
  /etc/profile.d/ocistage.sh, for every login shell without modules:
      case ":\$PATH:" in *":$prefix/bin:"*) ;; *) PATH="$prefix/bin:\$PATH" ;; esac
  bash completion for every user (bash-completion loads it on the first Tab):
      mkdir -p /usr/local/share/bash-completion/completions
      ln -s $prefix/$completion /usr/local/share/bash-completion/completions/ocistage
  pyxis (plugstack.conf; docs/pyxis.md):
      required /usr/lib/slurm/spank_pyxis.so importer=$prefix/bin/ocistage-pyxis-importer
  site settings: /etc/ocistage/config.toml (docs/config.md)
EOF
