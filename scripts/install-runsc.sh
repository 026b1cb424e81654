#!/usr/bin/env bash
# Installs a current gVisor runsc, pinned, at a fixed path beside Debian's
# older /usr/bin/runsc (which stays as the fallback). Idempotent: a binary
# already built from the pinned version, statically, is left alone.
#
# runsc MUST be built with CGO_ENABLED=0. `go install` on a host with gcc
# defaults to cgo and produces a dynamically linked binary whose ELF
# interpreter is /lib64/ld-linux-x86-64.so.2. `runsc boot` and `runsc gofer`
# pivot_root into an empty tmpfs and then re-exec /proc/self/exe (the proc
# umounter, runsc/cmd/sandboxsetup/process.go ExecProcUmounter); the kernel
# finds no interpreter in that root and execve fails with ENOENT:
#   error executing umounter: fork/exec /proc/self/exe: no such file or directory
# on every platform and with any flags. Upstream's release builds are static.
#
# Usage: scripts/install-runsc.sh [DEST]   (default /usr/local/lib/sandboxd/runsc)
set -euo pipefail

export PATH=/usr/local/go/bin:$PATH
module=gvisor.dev/gvisor
version=v0.0.0-20260905035102-160fafc42237
dest=${1:-/usr/local/lib/sandboxd/runsc}

# up_to_date BIN: BIN was built from the pinned module version without cgo,
# and says so in `runsc --version` (a plain `go install` prints
# VERSION_MISSING there; sandboxd keys its probe cache on that line).
# Each command's output is read whole before it is searched: piped into
# `grep -q`, which exits at its first match, the writer could die of
# SIGPIPE and fail the pipeline under pipefail, rejecting a good binary
# (3 checks in 20 did).
up_to_date() {
  local info said
  info=$(go version -m "$1" 2>/dev/null) || return 1
  said=$("$1" --version 2>/dev/null) || return 1
  awk -v m="$module" -v v="$version" '$1 == "mod" && $2 == m && $3 == v { ok = 1 } END { exit !ok }' <<<"$info" &&
    grep -qE '^[[:space:]]+build[[:space:]]+CGO_ENABLED=0$' <<<"$info" &&
    grep -qF "runsc version $version" <<<"$said"
}

if [[ -x $dest ]] && up_to_date "$dest"; then
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "install-runsc: building runsc $version (a few minutes on 2 cores)" >&2
CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath -ldflags="-s -w -X $module/runsc/version.version=$version" "$module/runsc@$version"

# Refuse a binary that would fail at sandbox boot.
if ! up_to_date "$tmp/runsc"; then
  echo "install-runsc: the built runsc is not a static $version build" >&2
  exit 1
fi

mkdir -p "$(dirname "$dest")"
install -m 0755 "$tmp/runsc" "$dest.new"
mv -f "$dest.new" "$dest"
echo "install-runsc: installed $dest ($version)" >&2
