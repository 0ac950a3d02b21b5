#!/usr/bin/env bash
# The main job, end to end on this machine: a local registry on 127.0.0.1, a small image built
# on the spot from Debian's busybox-static, `ocistage inspect`/`pull`/`bundle`, the bundle
# actually running under rootless runc, then `ocistage stage` (and the staged bundle running),
# `cache ls` and `unstage`.
set -euo pipefail

for tool in docker-registry umoci skopeo runc busybox ocistage; do
    command -v "$tool" >/dev/null || { echo "demo: $tool is missing; run \`make deps\`" >&2; exit 1; }
done

work=$(mktemp -d /tmp/ocistage-demo.XXXXXX)
port=${OCISTAGE_DEMO_PORT:-5055}
registry_pid=
cleanup() {
    [ -n "$registry_pid" ] && kill "$registry_pid" 2>/dev/null || true
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

say "starting a registry on 127.0.0.1:$port"
cat > "$work/registry.yml" <<YAML
version: 0.1
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: 127.0.0.1:$port
log:
  level: error
YAML
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$port/v2/" >/dev/null && break; sleep 0.1; done

say "building a busybox image with umoci"
umoci init --layout "$work/layout"
umoci new --image "$work/layout:demo"
umoci unpack --rootless --image "$work/layout:demo" "$work/build" >/dev/null
rootfs="$work/build/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/home/app" "$rootfs/data"
cp "$(command -v busybox)" "$rootfs/bin/busybox"
for applet in sh ls cat id echo env pwd uname; do ln -s busybox "$rootfs/bin/$applet"; done
printf 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\napp:x:1000:\n' > "$rootfs/etc/group"
printf 'NAME="ocistage demo"\nID=ocistage-demo\nVERSION_ID=1\n' > "$rootfs/etc/os-release"
umoci repack --image "$work/layout:demo" "$work/build" >/dev/null
umoci config --image "$work/layout:demo" --config.user app --config.workingdir /home/app \
    --config.env GREETING=hello-from-the-image \
    --config.entrypoint /bin/sh --config.cmd -c \
    --config.cmd 'echo "$GREETING: I am $(id -un) ($(id -u)) in $(pwd) on $(. /etc/os-release; echo $NAME)"'
skopeo copy -q --dest-tls-verify=false "oci:$work/layout:demo" "docker://127.0.0.1:$port/demo/busybox:1"

export OCISTAGE_CACHE="$work/cache"
# runc 1.1 (Debian 12) run by a user other than root needs container root mapped to that user
# (docs/runtime-config.md, map_root): the bundle runs as root inside, not as the image's `app`.
map_root=()
stage_source="127.0.0.1:$port/demo/busybox:1"
if [ "$(id -u)" != 0 ]; then
    map_root=(--map-root)
    stage_source="$work/bundle"
fi
say "ocistage inspect 127.0.0.1:$port/demo/busybox:1"
ocistage inspect "127.0.0.1:$port/demo/busybox:1"
say "ocistage pull 127.0.0.1:$port/demo/busybox:1"
ocistage pull "127.0.0.1:$port/demo/busybox:1"
say "ocistage bundle ${map_root[*]} 127.0.0.1:$port/demo/busybox:1 $work/bundle"
ocistage bundle "${map_root[@]}" "127.0.0.1:$port/demo/busybox:1" "$work/bundle"
say "runc --rootless=true run -b $work/bundle"
runc --rootless=true --root "$work/runc" run -b "$work/bundle" "ocistage-demo-$$" </dev/null

say "ocistage stage $stage_source --to $work/staged (as a job would)"
staged=$(ocistage stage "$stage_source" --to "$work/staged")
echo "$staged"
runc --rootless=true --root "$work/runc" run -b "$staged" "ocistage-demo-staged-$$" </dev/null
say "ocistage cache ls"
ocistage cache ls
say "ocistage unstage $staged"
ocistage unstage "$staged"
say "done"
