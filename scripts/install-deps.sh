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

# A current gVisor, pinned and built statically from the Go module proxy
# (see install-runsc.sh), which the gVisor backend prefers when a trial
# sandbox boots with it. Debian's runsc above stays as the fallback, so a
# failed build (no Go, no module proxy) is a warning, not the end of `make run`.
if [[ $(id -u) -eq 0 ]]; then
  "$(dirname "$0")/install-runsc.sh" ||
    echo "install-deps: could not install the current runsc; sandboxes will run on Debian's runsc" >&2
elif [[ ! -x /usr/local/lib/sandboxd/runsc ]]; then
  echo "install-deps: the current runsc is not installed (run as root: scripts/install-runsc.sh); Debian's runsc will be used" >&2
fi
