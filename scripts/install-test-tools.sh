#!/usr/bin/env bash
# Installs the tools the test suite runs beside sandboxd: Debian's chromium
# (the console's browser test), and what Debian does not package:
# versitygw, the S3-compatible server the blob store's S3 backend is tested
# against, and a Node.js recent enough for the e2b SDK tests (e2e/e2b; see
# install-node.sh). Idempotent: a tool already present at the pinned
# version is left alone. versitygw goes to $(go env GOPATH)/bin, where the
# tests look.
set -euo pipefail

# Node.js first: the versitygw steps below end the script early.
"$(dirname "$0")/install-node.sh"

# Debian's chromium, the headless browser the web console's test drives
# (e2e/console_test.go). Here rather than in install-deps.sh: only the
# tests need it, and it is large for `make run`.
if ! command -v chromium >/dev/null 2>&1; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-test-tools: chromium is missing (run as root, or: sudo apt-get install chromium)" >&2
  else
    echo "install-test-tools: installing chromium" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium >/dev/null
  fi
fi

# Debian's Jupyter stack: the code interpreter's unit tests
# (internal/guest/codeint) drive real kernels with it on the host.
if ! /usr/bin/python3 -c "import jupyter_client, ipykernel, pandas, matplotlib" >/dev/null 2>&1; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-test-tools: Debian's Jupyter packages are missing (run as root, or: sudo apt-get install python3-ipykernel python3-jupyter-client python3-pandas python3-matplotlib)" >&2
  else
    echo "install-test-tools: installing python3-ipykernel, python3-jupyter-client, python3-pandas, python3-matplotlib" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-ipykernel python3-jupyter-client python3-pandas python3-matplotlib >/dev/null
  fi
fi

export PATH=/usr/local/go/bin:$PATH
versitygw_module=github.com/versity/versitygw
versitygw_version=v1.8.0

gobin="$(go env GOPATH | cut -d: -f1)/bin"

# installed_version BIN MODULE prints the version of MODULE that the Go
# binary BIN was built from, or nothing.
installed_version() {
  go version -m "$1" 2>/dev/null | awk -v m="$2" '$1 == "mod" && $2 == m { print $3 }'
}

bin=$(command -v versitygw || true)
if [[ -n $bin && $bin != "$gobin/versitygw" ]]; then
  have=$(installed_version "$bin" "$versitygw_module")
  if [[ $have == "$versitygw_version" ]]; then
    exit 0
  fi
  # The tests take the first versitygw on PATH.
  echo "install-test-tools: warning: $bin is versitygw ${have:-of unknown version}, not $versitygw_version; it will be used" >&2
  exit 0
fi
bin="$gobin/versitygw"
if [[ -x $bin && $(installed_version "$bin" "$versitygw_module") == "$versitygw_version" ]]; then
  exit 0
fi
echo "install-test-tools: building versitygw $versitygw_version (about a minute)" >&2
start=$SECONDS
GOFLAGS= go install "$versitygw_module/cmd/versitygw@$versitygw_version"
echo "install-test-tools: versitygw installed in $gobin in $((SECONDS - start)) s" >&2
