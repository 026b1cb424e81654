// Package deploy_test checks the deployment files beside it, which no
// compiler reads: that the Kubernetes API would take every manifest as
// written (each document decoded strictly into its API type, so a
// misspelt or misplaced field fails here instead of being dropped by
// kubectl), that the manifests agree with one another, that every flag
// and SANDBOXD_* variable they and the systemd files set is one `sandboxd
// serve` has, and that systemd accepts the unit.
package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	manifestDir = "kubernetes"
	unitFile    = "systemd/sandboxd.service"
	envFile     = "systemd/sandboxd.env.example"
	// unitExec is the binary the unit starts.
	unitExec = "/usr/local/bin/sandboxd"
)

// document is one decoded document of a manifest file.
type document struct {
	where string // file:index, for messages
	obj   any    // *corev1.Namespace, *appsv1.DaemonSet, ...
}

// newObject returns an empty object of the API type that apiVersion and
// kind name, or nil for a kind these manifests have no business with.
// The apiVersion is part of the key: a DaemonSet of a retired group
// version (extensions/v1beta1) is refused by today's clusters.
func newObject(apiVersion, kind string) any {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}
	case "v1 Secret":
		return &corev1.Secret{}
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}
	case "v1 Service":
		return &corev1.Service{}
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	}
	return nil
}

// decodeStrict decodes one YAML document into the API type its apiVersion
// and kind name, failing on unknown kinds, unknown or duplicate fields and
// values of the wrong type.
func decodeStrict(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	obj := newObject(tm.APIVersion, tm.Kind)
	if obj == nil {
		return nil, fmt.Errorf("no API type here for apiVersion %q, kind %q", tm.APIVersion, tm.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, err
	}
	// UnmarshalStrict ends in encoding/json, which matches field names
	// regardless of case ("HostNetwork:" fills hostNetwork); the API
	// server's decoder does not, and drops such a field. Decode once more
	// as it does.
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, err
	}
	strict, err := sigsjson.UnmarshalStrict(j, newObject(tm.APIVersion, tm.Kind))
	if err != nil {
		return nil, err
	}
	if err := errors.Join(strict...); err != nil {
		return nil, err
	}
	return obj, nil
}

// loadManifests decodes every document of every YAML file in manifestDir.
func loadManifests(t *testing.T) []document {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.y*ml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no manifests in %s", manifestDir)
	}
	var docs []document
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(f))
		for i := 0; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: split documents: %v", file, err)
			}
			where := fmt.Sprintf("%s:%d", file, i)
			// A document of comments only is nothing to apply.
			if j, err := yaml.YAMLToJSON(doc); err == nil && string(j) == "null" {
				continue
			}
			obj, err := decodeStrict(doc)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			docs = append(docs, document{where: where, obj: obj})
		}
		f.Close()
	}
	return docs
}

// all returns the documents holding a *T.
func all[T any](docs []document) []*T {
	var out []*T
	for _, d := range docs {
		if o, ok := d.obj.(*T); ok {
			out = append(out, o)
		}
	}
	return out
}

// TestManifests decodes the manifests and checks what an API server would
// only find out when the pods run: that the objects are in one namespace
// and refer to each other correctly (volumes, secrets and their keys,
// named ports, selectors), and the essentials of the DaemonSet.
func TestManifests(t *testing.T) {
	docs := loadManifests(t)
	if t.Failed() {
		return
	}

	namespaces := all[corev1.Namespace](docs)
	if len(namespaces) != 1 {
		t.Fatalf("%d Namespaces, want 1", len(namespaces))
	}
	ns := namespaces[0].Name
	if namespaces[0].Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace %s does not allow privileged pods (pod-security.kubernetes.io/enforce)", ns)
	}
	for _, d := range docs {
		meta, ok := d.obj.(metav1.Object)
		if !ok {
			t.Fatalf("%s: %T has no metadata", d.where, d.obj)
		}
		if meta.GetName() == "" {
			t.Errorf("%s: no metadata.name", d.where)
		}
		if _, isNS := d.obj.(*corev1.Namespace); !isNS && meta.GetNamespace() != ns {
			t.Errorf("%s: namespace %q, want %q", d.where, meta.GetNamespace(), ns)
		}
	}

	secrets := map[string]*corev1.Secret{}
	for _, s := range all[corev1.Secret](docs) {
		secrets[s.Name] = s
	}
	secretHas := func(name, key string) bool {
		s, ok := secrets[name]
		if !ok {
			return false
		}
		_, inData := s.Data[key]
		_, inString := s.StringData[key]
		return inData || inString
	}

	daemonSets := all[appsv1.DaemonSet](docs)
	if len(daemonSets) == 0 {
		t.Fatal("no DaemonSet")
	}
	for _, ds := range daemonSets {
		checkDaemonSet(t, ds, secretHas)
	}

	// podsOf returns the DaemonSet whose pods sel selects.
	podsOf := func(sel labels.Selector) *appsv1.DaemonSet {
		for _, ds := range daemonSets {
			if sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
				return ds
			}
		}
		return nil
	}
	for _, svc := range all[corev1.Service](docs) {
		if len(svc.Spec.Selector) == 0 {
			t.Errorf("Service %s selects no pods", svc.Name)
			continue
		}
		ds := podsOf(labels.SelectorFromSet(svc.Spec.Selector))
		if ds == nil {
			t.Errorf("Service %s selects no DaemonSet's pods", svc.Name)
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.TargetPort.StrVal != "" && !hasPort(ds.Spec.Template.Spec, p.TargetPort.StrVal) {
				t.Errorf("Service %s: targetPort %q is no container port of DaemonSet %s", svc.Name, p.TargetPort.StrVal, ds.Name)
			}
		}
	}
	for _, np := range all[networkingv1.NetworkPolicy](docs) {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Errorf("NetworkPolicy %s: %v", np.Name, err)
			continue
		}
		ds := podsOf(sel)
		if ds == nil {
			t.Errorf("NetworkPolicy %s selects no DaemonSet's pods", np.Name)
			continue
		}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port != nil && p.Port.StrVal != "" && !hasPort(ds.Spec.Template.Spec, p.Port.StrVal) {
					t.Errorf("NetworkPolicy %s: port %q is no container port of DaemonSet %s", np.Name, p.Port.StrVal, ds.Name)
				}
			}
		}
	}
}

// checkDaemonSet checks one DaemonSet of sandboxd nodes: its selector,
// and for each container its volumes, secret references, probes and
// named ports.
func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet, secretHas func(name, key string) bool) {
	t.Helper()
	if ds.Spec.Selector == nil {
		t.Errorf("DaemonSet %s: no selector", ds.Name)
		return
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		t.Errorf("DaemonSet %s: %v", ds.Name, err)
		return
	}
	if !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("DaemonSet %s: selector %s does not match its pod labels %v", ds.Name, sel, ds.Spec.Template.Labels)
	}
	pod := ds.Spec.Template.Spec
	if pod.HostPID {
		t.Errorf("DaemonSet %s: hostPID", ds.Name)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
		if v.Secret != nil {
			for _, item := range v.Secret.Items {
				if !secretHas(v.Secret.SecretName, item.Key) {
					t.Errorf("DaemonSet %s: volume %s: no key %q in Secret %q", ds.Name, v.Name, item.Key, v.Secret.SecretName)
				}
			}
		}
	}
	if len(pod.Containers) == 0 {
		t.Errorf("DaemonSet %s: no containers", ds.Name)
	}
	for _, c := range pod.Containers {
		where := fmt.Sprintf("DaemonSet %s, container %s", ds.Name, c.Name)
		if !slices.Contains(append(slices.Clone(c.Command), c.Args...), "serve") {
			t.Errorf("%s: does not run sandboxd serve", where)
		}
		if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
			t.Errorf("%s: not privileged", where)
		}
		for _, m := range c.VolumeMounts {
			if _, ok := volumes[m.Name]; !ok {
				t.Errorf("%s: mounts undeclared volume %q", where, m.Name)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				ref := e.ValueFrom.SecretKeyRef
				if !secretHas(ref.Name, ref.Key) {
					t.Errorf("%s: %s: no key %q in Secret %q", where, e.Name, ref.Key, ref.Name)
				}
			}
		}
		probes := map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe}
		for kind, p := range probes {
			switch {
			case p == nil && kind != "startup":
				t.Errorf("%s: no %s probe", where, kind)
			case p == nil:
			case p.HTTPGet == nil || p.HTTPGet.Path != "/api/health":
				t.Errorf("%s: %s probe is not GET /api/health", where, kind)
			case p.HTTPGet.Port.StrVal != "" && !hasPort(pod, p.HTTPGet.Port.StrVal):
				t.Errorf("%s: %s probe's port %q is no container port", where, kind, p.HTTPGet.Port.StrVal)
			}
		}
		if len(c.Resources.Requests) == 0 {
			t.Errorf("%s: no resource requests", where)
		}
	}
}

// hasPort reports whether a container of pod declares a port named name.
func hasPort(pod corev1.PodSpec, name string) bool {
	for _, c := range pod.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

// moduleRoot is the sandboxd module's directory, this package's parent.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	return root
}

// serveHelp returns the text of `sandboxd serve --help`: from the module's
// own source with go run (so it is never stale), else from the bin/sandboxd
// of make build. It skips the test when neither can run.
func serveHelp(t *testing.T, root string) string {
	t.Helper()
	var errs []error
	if goBin, err := exec.LookPath("go"); err == nil {
		cmd := exec.Command(goBin, "run", "./cmd/sandboxd", "serve", "--help")
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err == nil {
			return string(out)
		}
		errs = append(errs, fmt.Errorf("go run ./cmd/sandboxd serve --help: %v: %s", err, bytes.TrimSpace(stderr.Bytes())))
	} else {
		errs = append(errs, err)
	}
	bin := filepath.Join(root, "bin", "sandboxd")
	out, err := exec.Command(bin, "serve", "--help").Output()
	if err == nil {
		t.Logf("flags from %s (go run failed: %v)", bin, errors.Join(errs...))
		return string(out)
	}
	errs = append(errs, fmt.Errorf("%s serve --help: %w", bin, err))
	t.Skipf("cannot list serve's flags: %v", errors.Join(errs...))
	return ""
}

// flagChecker says whether the flags and variables of the deployment files
// are ones serve has.
type flagChecker struct {
	t     *testing.T
	root  string
	help  string
	flags map[string]bool
	// source is the module's non-test Go source, read on first use.
	source []byte
}

func newFlagChecker(t *testing.T) *flagChecker {
	root := moduleRoot(t)
	help := serveHelp(t, root)
	c := &flagChecker{t: t, root: root, help: help, flags: map[string]bool{}}
	// A flag's line in cobra's help: "  -h, --help   help for serve".
	flagLine := regexp.MustCompile(`(?m)^\s+(?:-[[:alpha:]], )?--([a-z0-9][a-z0-9-]*)`)
	for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
		c.flags[m[1]] = true
	}
	if !c.flags["listen"] || !c.flags["data-dir"] {
		t.Fatalf("no --listen or --data-dir in serve's help; did its format change?\n%s", help)
	}
	return c
}

// flag checks a command-line argument of serve, given in where.
func (c *flagChecker) flag(where, arg string) {
	name, ok := strings.CutPrefix(arg, "--")
	if !ok || name == "" {
		return
	}
	name, _, _ = strings.Cut(name, "=")
	switch {
	case c.flags[name]:
	default:
		c.t.Errorf("%s: serve has no flag --%s", where, name)
	}
}

// env checks an environment variable set for serve in where. sandboxd
// reads every flag from SANDBOXD_ and its name upper-cased with '-' as
// '_' (cmd/sandboxd/env.go); a few credentials keep their tools' names,
// which the help gives as "(env NAME)"; a few variables are read directly
// (the S3 keys), which the source names. Variables outside these (POD_IP)
// are not sandboxd's business.
func (c *flagChecker) env(where, name string) {
	if strings.Contains(c.help, "(env "+name+")") {
		return
	}
	rest, ok := strings.CutPrefix(name, "SANDBOXD_")
	if !ok {
		return
	}
	flag := strings.ToLower(strings.ReplaceAll(rest, "_", "-"))
	switch {
	case c.flags[flag]:
	case c.inSource(name):
	default:
		c.t.Errorf("%s: %s is neither a serve flag's variable nor read by sandboxd", where, name)
	}
}

// inSource reports whether the module's non-test Go source under cmd/ and
// internal/ has name as a string literal.
func (c *flagChecker) inSource(name string) bool {
	if c.source == nil {
		var buf bytes.Buffer
		for _, dir := range []string{"cmd", "internal"} {
			err := filepath.WalkDir(filepath.Join(c.root, dir), func(path string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				if d.IsDir() && d.Name() == "testdata" {
					return filepath.SkipDir
				}
				if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
					return nil
				}
				b, err := os.ReadFile(path)
				buf.Write(b)
				return err
			})
			if err != nil {
				c.t.Fatal(err)
			}
		}
		c.source = buf.Bytes()
	}
	return bytes.Contains(c.source, []byte(`"`+name+`"`))
}

// serveArgs returns the arguments after "serve" in a command line (what
// comes before is the binary, or an init such as tini, and its options).
func serveArgs(argv []string) []string {
	if i := slices.Index(argv, "serve"); i >= 0 {
		return argv[i+1:]
	}
	return nil
}

// TestServeFlags checks that every flag and SANDBOXD_* variable the
// manifests and the systemd files give serve is one serve has.
func TestServeFlags(t *testing.T) {
	docs := loadManifests(t)
	unit := readUnit(t)
	c := newFlagChecker(t)

	for _, ds := range all[appsv1.DaemonSet](docs) {
		for _, ctr := range ds.Spec.Template.Spec.Containers {
			where := fmt.Sprintf("DaemonSet %s, container %s", ds.Name, ctr.Name)
			for _, arg := range serveArgs(append(slices.Clone(ctr.Command), ctr.Args...)) {
				c.flag(where, arg)
			}
			for _, e := range ctr.Env {
				c.env(where, e.Name)
			}
		}
	}
	for _, cm := range all[corev1.ConfigMap](docs) {
		for name := range cm.Data {
			c.env("ConfigMap "+cm.Name, name)
		}
	}

	for _, line := range unit.values("Service", "ExecStart") {
		for _, arg := range serveArgs(strings.Fields(line)) {
			c.flag(unitFile+" ExecStart", arg)
		}
	}

	// The example's optional settings are commented out; check them too.
	b, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	assign := regexp.MustCompile(`^#?\s*([A-Z][A-Z0-9_]*)=`)
	n := 0
	for i, line := range strings.Split(string(b), "\n") {
		if m := assign.FindStringSubmatch(line); m != nil {
			c.env(fmt.Sprintf("%s:%d", envFile, i+1), m[1])
			n++
		}
	}
	if n == 0 {
		t.Errorf("%s sets no variables", envFile)
	}
}

// unit is a systemd unit file: section → key → values, in order.
type unit map[string]map[string][]string

func (u unit) values(section, key string) []string { return u[section][key] }

// readUnit parses unitFile (comments, sections, key=value; the unit uses
// no continuation lines).
func readUnit(t *testing.T) unit {
	t.Helper()
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{}
	section := ""
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case strings.HasSuffix(line, "\\"):
			t.Fatalf("%s:%d: continuation lines are not parsed here", unitFile, i+1)
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a key=value in a section: %q", unitFile, i+1, line)
			}
			k = strings.TrimSpace(k)
			u[section][k] = append(u[section][k], strings.TrimSpace(v))
		}
	}
	return u
}

// TestSystemdUnit checks the settings the unit exists for, that it does
// not give sandboxd a mount namespace of its own, and that systemd
// accepts it (systemd-analyze verify, when there is one).
func TestSystemdUnit(t *testing.T) {
	u := readUnit(t)
	want := map[string]string{
		"Type":            "exec",
		"User":            "root",
		"EnvironmentFile": "/etc/sandboxd/sandboxd.env",
		"ExecStart":       unitExec + " serve",
		"Restart":         "on-failure",
		// sandboxes stay running across a restart of sandboxd, which
		// re-attaches them (--keep-sandboxes)
		"KillMode": "process",
		"Delegate": "yes",
	}
	for k, v := range want {
		if got := u.values("Service", k); !slices.Equal(got, []string{v}) {
			t.Errorf("[Service] %s=%q, want %q", k, got, v)
		}
	}
	if len(u.values("Service", "LimitNOFILE")) == 0 {
		t.Error("[Service] no LimitNOFILE")
	}
	// Each of these makes systemd start the service in a mount namespace
	// of its own, made anew at every start: the loop and overlay mounts
	// of sandboxes that keep running across a restart would stay in the
	// old namespace, and the restarted sandboxd would see their disks
	// unmounted.
	for _, k := range []string{
		"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateMounts",
		"ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
		"ProtectProc", "ProcSubset", "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths",
		"ExecPaths", "NoExecPaths", "TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths",
		"RootDirectory", "RootImage", "MountImages", "ExtensionImages", "DynamicUser",
		"PrivateUsers", "NetworkNamespacePath", "PrivateNetwork",
	} {
		if v := u.values("Service", k); len(v) > 0 {
			t.Errorf("[Service] %s=%v: sandboxd must share the host's namespaces", k, v)
		}
	}

	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze")
	}
	// verify insists that ExecStart's binary exists; this test's own
	// stands in for sandboxd, which need not be installed here.
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(b), "ExecStart="+unitExec+" ", "ExecStart="+self+" ", 1)
	path := filepath.Join(t.TempDir(), filepath.Base(unitFile))
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", path).CombinedOutput()
	if err != nil {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// Warnings (an unknown key, a bad value) do not change the exit code.
	// Those about other units (verify loads the ones it depends on) are
	// the host's business.
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		switch {
		case line == "":
		case strings.Contains(line, filepath.Base(unitFile)):
			t.Errorf("systemd-analyze verify: %s", line)
		default:
			t.Logf("systemd-analyze verify: %s", line)
		}
	}
}
