#!/usr/bin/env bash
# The structure figures issue 32 compares before and after (`make structure`):
# package count, hand-written lines, lines per package, the longest
# functions, imports between front ends, and sandbox.Manager's entry points.
# Copied blocks are measured apart (not by this script).
# Hand-written: .go files without the "// Code generated ... DO NOT EDIT."
# line, outside testdata and node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

# handwritten prints the module's hand-written .go files; "test" for the
# _test.go files, anything else for the others.
handwritten() {
	local which=$1
	find . \( -name .git -o -name node_modules -o -name testdata -o -name bin \) -prune -o -name '*.go' -type f -print |
		if [ "$which" = test ]; then grep '_test\.go$'; else grep -v '_test\.go$'; fi |
		sed 's|^\./||' | sort |
		while read -r f; do
			grep -qE '^// Code generated .* DO NOT EDIT\.$' "$f" || echo "$f"
		done
}

lines() { xargs -r cat | wc -l; }

echo "== packages: $($GO list ./... | wc -l) (go list ./...)"
nontest=$(handwritten nontest)
echo "== hand-written lines: $(echo "$nontest" | lines) outside tests, $(handwritten test | lines) in tests ($(echo "$nontest" | wc -l) and $(handwritten test | wc -l) files)"

echo
echo "== lines per package, the 15 largest (hand-written, tests left out)"
echo "$nontest" | while read -r f; do printf '%s %s\n' "$(dirname "$f")" "$(wc -l <"$f")"; done |
	awk '{n[$1] += $2} END {for (p in n) printf "%7d  %s\n", n[p], p}' | sort -rn | head -15

echo
ARCHTEST_REPORT=15 $GO test -count=1 -v -run '^TestReportStructure$' ./internal/archtest |
	grep -vE '^(=== RUN|--- PASS|PASS$|ok )'
