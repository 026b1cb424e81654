#!/usr/bin/env bash
# Installs what sandboxd and its tests need on a Debian 12 host, and nothing
# that is already there. Idempotent; safe to run before every `make` target.
set -euo pipefail

# Debian packages, as "command-or-path:package".
need=(
  "runsc:runsc"                                   # gVisor (2022): the fallback when the current runsc below cannot boot here
  "debootstrap:debootstrap"                       # builds the base image
  "/usr/share/keyrings/debian-archive-keyring.gpg:debian-archive-keyring"
  "/usr/lib/postgresql/15/bin/initdb:postgresql"  # tests run the store against PostgreSQL too
  "/bin/busybox:busybox-static"                   # tiny test root filesystems
  "zstd:zstd"
  "ip:iproute2"
  "mkfs.ext4:e2fsprogs"
  "git:git"
  "curl:curl"
  "cc:gcc"                                        # builds the statx shim that Debian's old runsc needs
  # The microVM backend: QEMU, and what building its guest kernel takes.
  "qemu-system-x86_64:qemu-system-x86"
  "/usr/src/linux-source-6.1.tar.xz:linux-source-6.1"
  "make:build-essential"
  "bc:bc"
  "bison:bison"
  "flex:flex"
  "/usr/include/libelf.h:libelf-dev"
  "/usr/include/openssl/ssl.h:libssl-dev"
  "xz:xz-utils"
  "cpio:cpio"
  "tmux:tmux"                                      # drives `sandbox connect` on a real terminal in the e2e tests
)

missing=()
for entry in "${need[@]}"; do
  probe=${entry%%:*} pkg=${entry##*:}
  if [[ $probe == /* ]]; then
    [[ -e $probe ]] || missing+=("$pkg")
  else
    command -v "$probe" >/dev/null 2>&1 || missing+=("$pkg")
  fi
done

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
  echo "install-deps: Go is at /usr/local/go/bin; add it to PATH" >&2
fi

# fallback_banner says loudly, on stderr, that sandboxes will run on
# Debian's 2022 runsc, why ($1), and what that costs: a line in the middle
# of a `make run` scrolls away unseen.
fallback_banner() {
  local rule='!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!'
  cat >&2 <<EOF

$rule
  install-deps: the current gVisor is NOT installed: $1
  Sandboxes will run on Debian's runsc (December 2022) instead, which costs:
    - pause and fork refuse a sandbox while TCP sockets are open in it;
    - the ptrace platform only: git, Python, npm run 2-3 times slower;
    - workarounds for statx (ls, stat) and for sandbox networks;
    - a path through a symlink to / resolves to / itself.
  Fix: run scripts/install-runsc.sh as root (it needs Go and the Go module
  proxy). sandboxd serve says the same at start, and GET /api/health lists
  it under "degraded".
$rule

EOF
}

# A current gVisor, pinned and built statically from the Go module proxy
# (see install-runsc.sh), which the gVisor backend prefers when a trial
# sandbox boots with it. Debian's runsc above stays as the fallback, so a
# failed build (no Go, no module proxy) does not end `make run`; it is
# said loudly.
if [[ $(id -u) -eq 0 ]]; then
  if ! "$(dirname "$0")/install-runsc.sh"; then
    if [[ -x /usr/local/lib/sandboxd/runsc ]]; then
      echo "install-deps: scripts/install-runsc.sh failed; the runsc installed before stays" >&2
    else
      fallback_banner "scripts/install-runsc.sh failed (its error is above)"
    fi
  fi
elif [[ ! -x /usr/local/lib/sandboxd/runsc ]]; then
  fallback_banner "not running as root, so scripts/install-runsc.sh was not run"
fi
