#!/usr/bin/env bash
# Ensures a Node.js and npm that the e2b SDK tests (e2e/e2b) run on: the SDK
# wants node >= 20.18.1 and not 21.x (its "engines"), and Debian 12 ships
# Node.js 18. A suitable node on PATH, with npm beside it, is kept. Otherwise
# Node.js is installed from the npm registry through npm itself (the
# platform package node-linux-<arch> holds the official binary; npm comes as
# the npm package) into a prefix of its own, which shadows nothing:
#   /usr/local/lib/sandboxd/node      as root
#   ~/.cache/sandboxd/node            otherwise
# SANDBOXD_NODE_PREFIX=DIR installs there instead, and SANDBOXD_NODE_FORCE=1
# installs even when PATH has a suitable node (both for trying this script
# out without touching the machine's node). install-test-tools.sh (so `make
# test`) runs it; e2e/e2b_test.go looks in both prefixes after PATH.
# Idempotent.
set -euo pipefail

# The versions the full image pins (internal/image/template.go).
NODE_VERSION=24.22.3
NPM_VERSION=12.2.2

# suitable NODE: whether NODE runs and its version is >= 20.18.1, not 21.x.
suitable() {
  local v
  v=$("$1" --version 2>/dev/null) || return 1
  v=${v#v}
  local major=${v%%.*} rest=${v#*.}
  local minor=${rest%%.*} patch=${rest#*.}
  patch=${patch%%[^0-9]*}
  [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ && $patch =~ ^[0-9]+$ ]] || return 1
  ((major >= 22)) && return 0
  ((major == 20 && (minor > 18 || (minor == 18 && patch >= 1))))
}

if [[ $(id -u) -eq 0 ]]; then
  default_prefix=/usr/local/lib/sandboxd/node
else
  default_prefix=${XDG_CACHE_HOME:-$HOME/.cache}/sandboxd/node
fi
prefix=${SANDBOXD_NODE_PREFIX:-$default_prefix}

if [[ ${SANDBOXD_NODE_FORCE:-} != 1 ]]; then
  if node=$(command -v node) && suitable "$node" && command -v npm >/dev/null 2>&1; then
    exit 0
  fi
fi
if [[ -x $prefix/bin/node && -x $prefix/bin/npm ]] && suitable "$prefix/bin/node" &&
  [[ $("$prefix/bin/node" --version) == "v$NODE_VERSION" ]]; then
  exit 0
fi

case $(uname -m) in
  x86_64) arch=x64 ;;
  aarch64) arch=arm64 ;;
  *)
    echo "install-node: no Node.js package for $(uname -m); install Node.js >= 20.18.1 yourself for the e2b SDK tests" >&2
    exit 1
    ;;
esac

# Any npm can fetch the packages, Debian's (with its Node.js 18) included.
if ! command -v npm >/dev/null 2>&1; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-node: npm is missing (run as root, or: sudo apt-get install npm)" >&2
    exit 1
  fi
  echo "install-node: installing Debian's npm to fetch Node.js $NODE_VERSION with" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends npm >/dev/null
fi

echo "install-node: installing Node.js $NODE_VERSION and npm $NPM_VERSION into $prefix" >&2
mkdir -p "$(dirname "$prefix")"
# Built beside the prefix and moved in whole, so an interrupted install
# leaves no half-made prefix behind (npm links bin/ relatively).
tmp=$(mktemp -d "$prefix.new.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp" # mktemp's 0700 would keep other users from this node
npm install --global --prefix "$tmp" --no-audit --no-fund --loglevel=error "node-linux-$arch@$NODE_VERSION" >&2
# npm itself, run by the node just installed.
PATH="$tmp/bin:$PATH" npm install --global --prefix "$tmp" --no-audit --no-fund --loglevel=error "npm@$NPM_VERSION" >&2
if ! suitable "$tmp/bin/node" || ! PATH="$tmp/bin:$PATH" "$tmp/bin/npm" --version >/dev/null; then
  echo "install-node: the installed Node.js or npm does not run" >&2
  exit 1
fi
rm -rf "$prefix"
mv "$tmp" "$prefix"
trap - EXIT
echo "install-node: $("$prefix/bin/node" --version) and npm $(PATH="$prefix/bin:$PATH" "$prefix/bin/npm" --version) in $prefix/bin" >&2
