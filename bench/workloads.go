package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// WorkloadOptions configure the syscall-heavy workloads: what a gVisor
// platform costs on real work rather than on a start or an exec.
type WorkloadOptions struct {
	// Rootfs is the full image's root filesystem (git, python3, node and
	// npm, and the agent CLIs' node_modules the npm project is made of).
	Rootfs    string
	StateDir  string // scratch; created and removed
	AgentPath string
	RunscPath string // empty: the runtime's choice
	Platform  string // empty: probed
	Runs      int    // timed runs of each workload (default 5), after one untimed
	Files     int    // files in the git repository (default 10,000)
	Logger    *slog.Logger
	Progress  progress.Tracker
}

// WorkloadReport is what RunWorkloads measured, in milliseconds timed
// inside the sandbox (no exec or start in the figures).
type WorkloadReport struct {
	Platform string            `json:"platform"`
	Runsc    string            `json:"runsc"`
	Rootfs   string            `json:"rootfs"`
	Files    int               `json:"git_files"`
	Packages int               `json:"npm_packages"`
	SetupMs  float64           `json:"setup_ms"`
	Results  map[string]Timing `json:"results"`
}

// workloadScript runs inside the sandbox. Setup (untimed): a git repository
// of $FILES committed files; an npm project whose dependencies are up to 60
// packages of the image's global node_modules without dependencies of
// their own, packed as tarballs in vendor/ and locked by an offline
// `npm install` (no registry: the sandbox has no network). Then $RUNS + 1
// rounds of each workload, the first untimed; each timed one prints
// "time NAME MS".
const workloadScript = `set -eu
export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
W=/workspace/wl
rm -rf "$W"; mkdir -p "$W/repo" "$W/proj/vendor"
cd "$W/repo"
python3 - "$FILES" <<'PY'
import os, sys
for i in range(int(sys.argv[1])):
    d = "d%03d" % (i // 100)
    os.makedirs(d, exist_ok=True)
    with open("%s/f%03d.txt" % (d, i % 100), "w") as f:
        f.write("file %d\n" % i)
PY
git init -q && git add -A && git -c user.name=bench -c user.email=bench@localhost commit -qm files
cd "$W/proj"
node - <<'JS' > ../pkgs
const fs = require("fs"), path = require("path");
const seen = new Map();
function walk(d, depth) {
  if (depth > 4) return;
  let ents; try { ents = fs.readdirSync(d); } catch { return; }
  for (const e of ents) {
    const p = path.join(d, e);
    if (e.startsWith("@")) { walk(p, depth); continue; }
    try {
      const j = JSON.parse(fs.readFileSync(path.join(p, "package.json")));
      const s = j.scripts || {};
      if (j.name && j.version && !j.dependencies && !j.optionalDependencies && !j.peerDependencies &&
          !s.install && !s.preinstall && !s.postinstall && !seen.has(j.name)) seen.set(j.name, p);
    } catch {}
    walk(path.join(p, "node_modules"), depth + 1);
  }
}
for (const r of ["/usr/lib/node_modules", "/usr/local/lib/node_modules"]) walk(r, 0);
for (const p of seen.values()) console.log(p);
JS
n=0
while read -r p; do
  [ "$(du -sk "$p" | cut -f1)" -le 1500 ] || continue
  tar -czf "vendor/p$n.tgz" --exclude=node_modules -C "$(dirname "$p")" --transform "s,^$(basename "$p"),package," "$(basename "$p")"
  n=$((n + 1)); [ $n -lt 60 ] || break
done < ../pkgs
node - <<'JS'
const fs = require("fs"), zlib = require("zlib");
const deps = {};
for (const f of fs.readdirSync("vendor")) {
  // The name is in package/package.json of the tarball: read it from the
  // tar stream (512-byte headers, name at 0, size at 124).
  const t = zlib.gunzipSync(fs.readFileSync("vendor/" + f));
  for (let o = 0; o + 512 <= t.length;) {
    const name = t.toString("utf8", o, o + 100).replace(/\0.*$/s, "");
    const size = parseInt(t.toString("utf8", o + 124, o + 136).replace(/\0.*$/s, "").trim() || "0", 8);
    if (!name) break;
    if (name === "package/package.json") { deps[JSON.parse(t.toString("utf8", o + 512, o + 512 + size)).name] = "file:vendor/" + f; break; }
    o += 512 + Math.ceil(size / 512) * 512;
  }
}
fs.writeFileSync("package.json", JSON.stringify({ name: "wl", version: "1.0.0", private: true, dependencies: deps }, null, 2));
JS
npm install --offline --no-audit --no-fund --loglevel=error >/dev/null
echo "packages $(ls vendor | wc -l)"
echo "setup-done"
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
r=0
while [ $r -le "$RUNS" ]; do
  cd "$W/repo"; t=$(date +%s%N); git status --porcelain >/dev/null; d=$(ms $t)
  [ $r -eq 0 ] || echo "time git_status_${FILES}_files $d"
  cd /; t=$(date +%s%N); python3 -c 'import json, email, http.client'; d=$(ms $t)
  [ $r -eq 0 ] || echo "time python3_import_json_email_http_client $d"
  t=$(date +%s%N); node -e 0; d=$(ms $t)
  [ $r -eq 0 ] || echo "time node_startup $d"
  cd "$W/proj"; rm -rf node_modules; t=$(date +%s%N); npm ci --offline --no-audit --no-fund --loglevel=error >/dev/null; d=$(ms $t)
  [ $r -eq 0 ] || echo "time npm_ci_offline $d"
  r=$((r + 1))
done
`

// RunWorkloads starts one sandbox of o.Rootfs and runs the workloads in it.
func RunWorkloads(ctx context.Context, o WorkloadOptions) (_ WorkloadReport, err error) {
	if o.Runs <= 0 {
		o.Runs = 5
	}
	if o.Files <= 0 {
		o.Files = 10000
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ph := startPhases(progress.Or(o.Progress), "bench workloads", 2)
	defer func() { ph.done(err) }()
	rep := WorkloadReport{Rootfs: o.Rootfs, Files: o.Files, Results: map[string]Timing{}}
	if o.Rootfs == "" {
		return rep, fmt.Errorf("workloads need the full image's root filesystem (--rootfs)")
	}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return rep, err
	}
	defer os.RemoveAll(o.StateDir)
	rt, err := gvisor.New(ctx, gvisor.Options{
		StateDir: filepath.Join(o.StateDir, "workloads"), RunscPath: o.RunscPath, AgentPath: o.AgentPath, Platform: o.Platform,
		DefaultLimits: runtime.Limits{CPUs: 2, MemoryBytes: 2 << 30, Pids: 1024, DiskBytes: 4 << 30}, Logger: o.Logger,
	})
	if err != nil {
		return rep, err
	}
	defer rt.Close()
	rep.Platform, _ = rt.Platform()
	rep.Runsc = rt.Runsc().String()
	sb, err := rt.Create(ctx, runtime.Spec{ID: "workloads", BaseDir: o.Rootfs, BaseImage: "workloads"})
	if err != nil {
		return rep, err
	}
	defer sb.Destroy(context.WithoutCancel(ctx))
	ph.next(fmt.Sprintf("setup (%d files, npm packages) on %s", o.Files, rep.Platform))
	pr, pw := io.Pipe()
	var stderr strings.Builder
	start := time.Now()
	samples := map[string][]time.Duration{}
	done := make(chan error, 1)
	go func() {
		res, err := sb.Exec(ctx, runtime.ExecRequest{
			Cmd:    []string{"sh", "-c", workloadScript},
			Env:    []string{"FILES=" + strconv.Itoa(o.Files), "RUNS=" + strconv.Itoa(o.Runs)},
			Stdout: pw, Stderr: &stderr, Timeout: 30 * time.Minute,
		})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("workload script exited %d: %s", res.ExitCode, lastLines(stderr.String(), 5))
		}
		pw.CloseWithError(err)
		done <- err
	}()
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 1 && f[0] == "setup-done":
			rep.SetupMs = ms(time.Since(start))
			ph.next(fmt.Sprintf("%d runs of each workload (setup took %.1f s)", o.Runs, rep.SetupMs/1000))
		case len(f) == 2 && f[0] == "packages":
			rep.Packages, _ = strconv.Atoi(f[1])
		case len(f) == 3 && f[0] == "time":
			n, err := strconv.Atoi(f[2])
			if err == nil {
				samples[f[1]] = append(samples[f[1]], time.Duration(n)*time.Millisecond)
			}
		}
	}
	if err := <-done; err != nil {
		return rep, err
	}
	for k, ds := range samples {
		rep.Results[k] = timing(ds)
	}
	return rep, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
