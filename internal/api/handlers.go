package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/persist"
	"github.com/sandboxd/sandboxd/internal/store"
)

func (s *Server) routeTable() []route {
	return []route{
		{method: http.MethodGet, path: "/api/health", summary: "Liveness and version", tag: "meta", public: true, ok: contract.HealthResponse{}, handler: s.health},
		{method: http.MethodGet, path: "/api/openapi.json", summary: "This document", tag: "meta", public: true, handler: s.serveOpenAPI},
		{method: http.MethodPost, path: "/api/sandboxes", summary: "Create a sandbox", tag: "sandboxes",
			description: "Creates a sandbox from the account's snapshot (or fresh) and, with command or prompt, starts a run-sandbox-command run whose id is returned as runId. With template (sandboxd), from that template instead (never the account's snapshot): 404 when the account has no such template and there is no public one, 409 while it builds or when its build failed, 400 on a backend that cannot run it. With snapshot (sandboxd), from the account's named snapshot (POST /api/sandboxes/{id}/snapshots): 404 when the account has none of that name or id; not with template. With volumes (sandboxd), the account's volumes (POST /api/volumes) are mounted at their paths: 404 for a volume the account does not have; 409 for one another sandbox has read-write, or has at all when this mount is read-write, and on a gVisor server for one a microVM wrote; 400 for a bad or overlapping path or a volume named twice.",
			body:        contract.CreateSandboxRequest{}, ok: contract.SandboxesResponse{}, handler: s.createSandbox},
		{method: http.MethodGet, path: "/api/sandboxes", summary: "List the account's sandboxes, snapshot, repository and file tree", tag: "sandboxes",
			query: contract.ListSandboxesQuery{}, ok: contract.ListSandboxesResponse{}, paged: true, handler: s.listSandboxes},
		{method: http.MethodPatch, path: "/api/sandboxes", summary: "Set the account's snapshot or repository", tag: "sandboxes",
			description: "Answers the account's snapshot row itself (the published UpdateSnapshotResponse), or null while the account has no snapshot.",
			body:        contract.PatchSandboxesRequest{}, ok: contract.SnapshotRow{}, okNullable: true, handler: s.patchSandboxes},
		{method: http.MethodDelete, path: "/api/sandboxes", summary: "Remove the account's environment", tag: "sandboxes",
			body: contract.AccountRequest{}, ok: contract.DeleteSandboxesResponse{}, handler: s.deleteSandboxes},
		{method: http.MethodPost, path: "/api/sandboxes/setup", summary: "Provision the account's sandbox (the setup-sandbox task)", tag: "sandboxes",
			description: "Starts the setup-sandbox task for the account, or answers the run already queued or executing.",
			body:        contract.AccountRequest{}, ok: contract.RunResponse{}, handler: s.setupSandbox},
		{method: http.MethodPost, path: "/api/sandboxes/files", summary: "Add files from URLs to the account's repository", tag: "files",
			description: "Also takes multipart/form-data (file parts, path, message). Counts against the account's repository quota: 429 when the upload would pass it, or needs more of its room than the account's other uploads in flight left (on every node; the message names the quota and what they hold).",
			body:        contract.UploadFilesRequest{}, ok: contract.UploadFilesResponse{}, handler: s.uploadFiles},
		{method: http.MethodGet, path: "/api/sandboxes/file", summary: "Read one file of the account's repository", tag: "files",
			query: contract.FileQuery{}, ok: contract.FileResponse{}, handler: s.readFile},
		{method: http.MethodGet, path: "/api/tasks/runs", summary: "Get a run, or list the account's runs", tag: "runs",
			query: contract.RunsQuery{}, ok: contract.RunsResponse{}, paged: true, handler: s.listRuns},
		{method: http.MethodGet, path: "/api/tasks/runs/{id}/log", summary: "Follow a run's log as Server-Sent Events (sandboxd)", tag: "runs",
			description: "text/event-stream: \"log\" events {\"data\"} carry the run's log as it grows (each line tagged [stdout] or [stderr]), then one \"end\" event {\"status\"} once the run finished (at once for a finished run); \"error\" {\"error\",\"statusCode\"} when the log cannot be read. A run without a log (not started yet, a task's run, or pruned) sends only its end.",
			query:       contract.AccountRequest{}, ok: RunLogEnd{}, eventsOnly: true, handler: s.runLog},
		{method: http.MethodGet, path: "/api/snapshots", summary: "List the account's snapshots, newest first (sandboxd)", tag: "snapshots",
			description: "The account's snapshot history: each filesystem layer with its parent, the sandbox it was taken of, its stored size and depth, and which one the account's next sandbox starts from (current). Read only; PATCH /api/sandboxes chooses one. Named holds the account's named snapshots (POST /api/sandboxes/{id}/snapshots), newest first; sandbox_id keeps those of one sandbox.",
			query:       SnapshotsQuery{}, ok: SnapshotsResponse{}, handler: s.listSnapshots},
		{method: http.MethodGet, path: "/api/events", summary: "List the account's lifecycle events (sandboxd)", tag: "events",
			description: "Each change of the account's sandboxes, recorded with the change: sandbox.created, sandbox.running, sandbox.paused, sandbox.resumed, sandbox.updated (a new timeout), sandbox.snapshot (a named snapshot taken), run.finished, sandbox.stopped and sandbox.failed (with its reason). Newest first (order=asc: oldest first), 50 a page (limit up to 100), the next page's cursor in X-Next-Cursor; sandbox_id, type (comma-separated) and since (RFC 3339: at or after it) filter. Events are kept --keep-events (default 7 days).",
			query:       contract.EventsQuery{}, ok: contract.EventsResponse{}, paged: true, handler: s.listEvents},
		{method: http.MethodPost, path: "/api/webhooks", summary: "Register a webhook for the account's lifecycle events (sandboxd)", tag: "events",
			description: "Each event the webhook takes (events; all when absent) is POSTed to url as JSON (GET /api/events' event with account_id), signed: Sandboxd-Signature is v1= and the hex HMAC-SHA256, keyed with the secret, of Sandboxd-Timestamp, '.', and the body. A delivery that gets no 2xx is retried with backoff (twice the wait each time, from --webhook-retry-base) up to 8 attempts; GET /api/webhooks/{id}/deliveries shows each. The secret (made when not given) is answered here only. 400 for a URL the server may not reach (private, loopback and metadata addresses, unless --webhooks-allow-private; metadata never), an unknown event type, a short secret; 409 over 20 webhooks.",
			body:        contract.WebhookRequest{}, ok: contract.WebhookResponse{}, conflict: "The account has the most webhooks it may have", handler: s.createWebhook},
		{method: http.MethodGet, path: "/api/webhooks", summary: "List the account's webhooks (sandboxd)", tag: "events",
			description: "A sandbox's own key may not: a webhook's URL may carry its receiver's token.",
			query:       contract.DeliveriesQuery{}, ok: contract.WebhooksResponse{}, acts: readsWebhooks, handler: s.listWebhooks},
		{method: http.MethodGet, path: "/api/webhooks/{id}", summary: "Get a webhook (sandboxd)", tag: "events",
			description: "A sandbox's own key may not: a webhook's URL may carry its receiver's token.",
			query:       contract.DeliveriesQuery{}, ok: contract.WebhookResponse{}, acts: readsWebhooks, handler: s.getWebhook},
		{method: http.MethodPatch, path: "/api/webhooks/{id}", summary: "Change a webhook: its url, name, events, secret or enabled (sandboxd)", tag: "events",
			body: contract.WebhookRequest{}, ok: contract.WebhookResponse{}, handler: s.updateWebhook},
		{method: http.MethodDelete, path: "/api/webhooks/{id}", summary: "Delete a webhook; what it had not delivered is cancelled (sandboxd)", tag: "events",
			query: contract.DeliveriesQuery{}, ok: contract.WebhookResponse{}, handler: s.deleteWebhook},
		{method: http.MethodGet, path: "/api/webhooks/{id}/deliveries", summary: "A webhook's deliveries, newest first, with each one's attempts (sandboxd)", tag: "events",
			description: "A sandbox's own key may not (as the webhook itself).",
			query:       contract.DeliveriesQuery{}, ok: contract.DeliveriesResponse{}, acts: readsWebhooks, handler: s.listDeliveries},
		{method: http.MethodGet, path: "/api/snapshots/{name}", summary: "Get a named snapshot (sandboxd)", tag: "snapshots",
			description: "name is the snapshot's name[:tag] (tag latest by default) or its id. Another account's is 404.",
			query:       NamedSnapshotQuery{}, ok: contract.NamedSnapshotResponse{}, handler: s.getNamedSnapshot},
		{method: http.MethodDelete, path: "/api/snapshots/{name}", summary: "Delete a named snapshot (sandboxd)", tag: "snapshots",
			description: "Answers the snapshot as it was. 409 while a running or paused sandbox started from it. Its stored layer goes when no template or snapshot names it.",
			query:       NamedSnapshotQuery{}, ok: contract.NamedSnapshotResponse{}, conflict: "Running or paused sandboxes started from the snapshot", handler: s.deleteNamedSnapshot},
		{method: http.MethodPost, path: "/api/snapshots/{name}/template", summary: "Make a template of a named snapshot (sandboxd)", tag: "snapshots",
			description: "A template of the account, named name[:tag], with the snapshot's files, base, config and start and ready commands; it stays when the snapshot is replaced or deleted. 409 when the account has a template or snapshot of that name and tag.",
			body:        contract.PromoteSnapshotRequest{}, ok: contract.TemplateResponse{}, conflict: "The account has a template or snapshot of that name and tag", handler: s.promoteSnapshot},
		{method: http.MethodPost, path: "/api/sandboxes/{id}/snapshots", summary: "Save a running sandbox's files as a named snapshot (sandboxd)", tag: "snapshots",
			description: "Captures the sandbox's files now (not its memory or processes; pause keeps those) as a named snapshot of the sandbox's account: POST /api/sandboxes with snapshot starts sandboxes from it, any number, on any node. A snapshot of that name and tag is replaced: the name moves to the new one, and the old one stays for the sandboxes that run it. Without name, the snapshot is named by its id. The sandbox runs on (a paused one is resumed). 409 when a template of the account has that name and tag, or the sandbox is not running; 400 for a fork, or on a backend that cannot run templates. Answers once the snapshot is ready.",
			body:        contract.CreateSnapshotRequest{}, ok: contract.NamedSnapshotResponse{}, conflict: "A template has that name and tag, or the sandbox is not running", handler: s.createSnapshot},
		{method: http.MethodPost, path: "/api/volumes", summary: "Create a volume: a persistent disk of the account that sandboxes mount (sandboxd)", tag: "volumes",
			description: "Records an ext4 volume of size_mb MiB (default 1024; a whole number of MiB and at least 64; at most the server's bound for one volume) named name; its disk is made at its first attach. POST /api/sandboxes mounts it (volumes): its data outlives every sandbox. 400 for a bad name or size; 409 when the account has a volume of that name; 429 over the account's volume count or the sum of their sizes.",
			body:        contract.CreateVolumeRequest{}, ok: contract.VolumeResponse{}, conflict: "The account has a volume of that name", handler: s.createVolume},
		{method: http.MethodGet, path: "/api/volumes", summary: "List the account's volumes by name (sandboxd)", tag: "volumes",
			description: "Each volume with the sandboxes it is attached to now.",
			query:       contract.AccountRequest{}, ok: contract.VolumesResponse{}, handler: s.listVolumes},
		{method: http.MethodGet, path: "/api/volumes/{name}", summary: "Get a volume with the sandboxes it is attached to (sandboxd)", tag: "volumes",
			description: "name is the volume's name or id (vol_...). 404 when the account has none (another account's is 404).",
			query:       contract.AccountRequest{}, ok: contract.VolumeResponse{}, handler: s.getVolume},
		{method: http.MethodPatch, path: "/api/volumes/{name}", summary: "Grow a volume (sandboxd)", tag: "volumes",
			description: "Sets the volume's size to size_mb MiB. A volume only grows (a smaller size is 400; the same size answers it as it is); its file system grows at its next attach. 409 while a sandbox has it attached; 404 when the account has no such volume; 429 past the account's quota.",
			body:        contract.ResizeVolumeRequest{}, ok: contract.VolumeResponse{}, conflict: "The volume is attached to a sandbox", handler: s.resizeVolume},
		{method: http.MethodDelete, path: "/api/volumes/{name}", summary: "Delete a volume and its data (sandboxd)", tag: "volumes",
			description: "Answers the volume as it was. Its data is gone for good. 409 while a sandbox has it attached; 404 when the account has no such volume.",
			query:       contract.AccountRequest{}, ok: contract.VolumeResponse{}, conflict: "The volume is attached to a sandbox", handler: s.deleteVolume},
		{method: http.MethodPost, path: "/api/volumes/{name}/fork", summary: "Copy a volume's data into a new volume (sandboxd)", tag: "volumes",
			description: "Makes the account's volume name (the body's), of the same size, with the volume's data as it is now; the two are independent from then on (forked_from names the source). A volume attached read-only may be forked. 409 when the account has a volume of that name, while a sandbox has the volume attached read-write (its data is changing), or when its newest data is on another node of a cluster; 404 when the account has no such volume; 429 past the account's quota.",
			body:        contract.ForkVolumeRequest{}, ok: contract.VolumeResponse{}, conflict: "The account has a volume of that name, or the volume is attached read-write", handler: s.forkVolume},
		{method: http.MethodGet, path: "/api/model/usage", summary: "The account's model proxy usage today and its daily budgets (sandboxd)", tag: "model",
			description: "What the account's sandboxes used today (UTC, on every node) of the operator's model providers through the model proxy (http://sandboxd.internal/model/...): requests forwarded and the tokens the providers reported, against the daily budgets the server holds each account to (null: unlimited). Past a budget the proxy answers 429 until resets_at. A sandbox's own key may read it.",
			query:       contract.AccountRequest{}, ok: ModelUsageResponse{}, handler: s.modelUsage},
		{method: http.MethodPost, path: "/api/sandboxes/{id}/exec", summary: "Run a command in a live sandbox", tag: "sandboxes",
			description: "Answers the whole result as JSON, or streams stdout/stderr/exit as Server-Sent Events with Accept: text/event-stream. A command whose client goes away runs on in the sandbox (GET .../processes lists it; its output from then on is dropped) unless the request says killOnDisconnect: true.",
			body:        contract.ExecRequest{}, ok: contract.ExecResponse{}, stream: true, handler: s.execSandbox},
		{method: http.MethodGet, path: "/api/sandboxes/{id}/exec", summary: "Run an interactive command in a live sandbox over a websocket (sandboxd)", tag: "sandboxes",
			description: "Upgrade: websocket; the key in x-api-key, Authorization: Bearer, or (browsers) as the subprotocol sandboxd.key.<KEY>. The first message is text, the JSON body of POST .../exec (a pty object gives a terminal); then binary messages are input and text messages controls: {\"type\":\"resize\",\"rows\",\"cols\"}, {\"type\":\"signal\",\"signal\":\"SIGINT\"|\"SIGTERM\"|\"SIGKILL\"|\"SIGHUP\"|\"SIGQUIT\"}, {\"type\":\"eof\"}; messages are at most 64 KiB. The server sends binary messages whose first byte is the stream (1 stdout, 2 stderr), then {\"type\":\"exit\",\"exitCode\",\"oomKilled\",\"durationMs\"} or {\"type\":\"error\",\"error\"}, and closes. Closing the socket kills the command: an interactive session ends with its socket (killOnDisconnect: false is refused). Refusals before the upgrade are those of POST .../exec (404, 409).",
			query:       contract.AccountRequest{}, websocket: true, acts: "it runs a command", handler: s.execInteractive},
		{method: http.MethodPost, path: "/api/sandboxes/{id}/stop", summary: "Stop a sandbox", tag: "sandboxes",
			body: contract.AccountRequest{}, ok: contract.SandboxResponse{}, handler: s.stopSandbox},
		{method: http.MethodPost, path: "/api/sandboxes/{id}/timeout", summary: "Set a sandbox's remaining lifetime", tag: "sandboxes",
			body: contract.TimeoutRequest{}, ok: contract.SandboxResponse{}, handler: s.setTimeout},
		{method: http.MethodPost, path: "/api/sandboxes/{id}/pause", summary: "Pause a running sandbox with its memory (sandboxd)", tag: "sandboxes",
			description: "Saves the sandbox whole on its node (memory, processes, files) and stops it running: it uses no CPU or memory, and its timeout does not run (sandboxStatus paused). Exec, files, ports, processes and the port proxy resume it first. Pausing a paused sandbox answers it as it is; 409 while a run executes in it or once it stopped; 400 when the server's runtime cannot pause, and for memory false (a pause of the files alone is not done: a named snapshot saves the files).",
			body:        contract.PauseRequest{}, ok: contract.SandboxResponse{}, handler: s.pauseSandbox},
		{method: http.MethodPost, path: "/api/sandboxes/{id}/resume", summary: "Resume a paused sandbox where it was (sandboxd)", tag: "sandboxes",
			description: "Its processes carry on from where they were; its timeout runs again from what was left. Resuming a running sandbox answers it as it is; 409 once it stopped.",
			body:        contract.AccountRequest{}, ok: contract.SandboxResponse{}, handler: s.resumeSandbox},
		{method: http.MethodPost, path: "/api/sandboxes/{id}/fork", summary: "Start sandboxes from a running sandbox's memory and filesystem (sandboxd)", tag: "sandboxes",
			description: "Starts count new sandboxes (1 to 20, default 1) of the same account, each a copy of the sandbox at one moment: its processes with their memory, its files and its network policy; the sandbox itself runs on. Each child has its own id, key, lifetime (timeout, default the server's) and network address; processes copied from the parent keep the parent's environment, and those the child starts get its own. All are started or none: 429 when the account or the server has no room for all, 409 while a run executes in the sandbox, once it stopped, or when the runtime cannot save it now (the reason is given); 400 when the server's runtime cannot fork. A paused sandbox is resumed first.",
			body:        contract.ForkRequest{}, ok: contract.SandboxesResponse{}, handler: s.forkSandbox},
		{method: http.MethodDelete, path: "/api/sandboxes/{id}", summary: "Delete a stopped or failed sandbox now (sandboxd)", tag: "sandboxes",
			description: "Removes the sandbox with its keys and E2B record, as retention does --keep-stopped-sandboxes after it ended, and answers it as it was. 409 while it is pending, running, paused or stopping (stop it first), or while a run that has not finished names it.",
			body:        contract.AccountRequest{}, ok: contract.SandboxResponse{}, handler: s.deleteSandbox},
		{method: http.MethodGet, path: "/api/sandboxes/{id}/files", summary: "Copy a file or directory out of a running sandbox as a tar archive (sandboxd)", tag: "sandboxes",
			description: "application/x-tar: path (absolute, or relative to /workspace) under its base name and, for a directory, everything below it; links are kept as links, never followed. At most 1 GiB of content in 100,000 entries, measured before the answer starts (413 beyond). A sandbox's own key may not call it (it reads the sandbox as exec would).",
			query:       SandboxPathQuery{}, rawOK: tarType, acts: readsSandbox, handler: s.copyOut},
		{method: http.MethodPut, path: "/api/sandboxes/{id}/files", summary: "Copy a tar archive into a directory of a running sandbox (sandboxd)", tag: "sandboxes",
			description: "Writes the application/x-tar body's files (with their permission bits) and directories into the directory path (absolute, or relative to /workspace; made when missing), as the sandbox's root user; links and special files are skipped and named in skipped. Entries are written as they arrive: a refused or broken archive leaves those before it. An entry whose name leaves path is refused (400). At most 1 GiB of content in 100,000 entries (413).",
			query:       SandboxPathQuery{}, rawBody: tarType, ok: CopyInResponse{}, handler: s.copyIn},
		{method: http.MethodGet, path: "/api/sandboxes/{id}/files/stat", summary: "Describe a path in a running sandbox (sandboxd)", tag: "sandboxes",
			description: "What path (absolute, or relative to /workspace) is, without following a final link; 404 when it does not exist. A sandbox's own key may not call it.",
			query:       SandboxPathQuery{}, ok: PathStatResponse{}, acts: readsSandbox, handler: s.statSandboxPath},
		{method: http.MethodPatch, path: "/api/sandboxes/{id}/network", summary: "Replace a running sandbox's network policy (sandboxd)", tag: "sandboxes",
			description: "Takes effect at once for new and open connections, without restarting the sandbox; stored on the sandbox so a restart rebuilds it. Only a sandbox created with a network has one to change (to \"none\" and back is allowed).",
			body:        contract.NetworkRequest{}, ok: contract.SandboxResponse{}, handler: s.setNetwork},
		{method: http.MethodGet, path: "/api/sandboxes/{id}/ports", summary: "List the ports listening in a sandbox", tag: "sandboxes",
			query: contract.AccountRequest{}, ok: contract.PortsResponse{}, handler: s.ports},
		{method: http.MethodPost, path: "/api/sandboxes/{id}/code", summary: "Run code in a stateful code context of a sandbox (sandboxd)", tag: "code",
			description: "The sandbox's code interpreter (docs/CODE.md): a Jupyter kernel per context keeps its variables between executions. Answers the whole execution as JSON (results with every representation the kernel gave: text, html, png, data of a DataFrame, chart of a matplotlib figure..., logs, error), or streams it: Accept: text/event-stream sends an event per output line (number_of_executions, stdout, stderr, result, error; the data are E2B's lines) then \"end\" {durationMs}, or \"failed\" {error, statusCode} when the interpreter's stream broke; Accept: application/x-ndjson sends E2B's code-interpreter lines as they are. A client that goes away, or a timeout, interrupts the cell and leaves the context usable. 400 when the sandbox has no kernel for the language (the message names those it has: start it from the code-interpreter template); 404 for an unknown contextId.",
			body:        contract.CodeRequest{}, ok: contract.CodeResponse{}, stream: true, handler: s.runCode},
		{method: http.MethodGet, path: "/api/sandboxes/{id}/code/contexts", summary: "List a sandbox's code contexts (sandboxd)", tag: "code",
			description: "The contexts made with POST .../code/contexts and the default contexts of the languages code ran in; they live as long as the sandbox runs (a pause keeps them).",
			query:       contract.AccountRequest{}, ok: contract.CodeContextsResponse{}, handler: s.codeContexts},
		{method: http.MethodPost, path: "/api/sandboxes/{id}/code/contexts", summary: "Start a code context: a new kernel (sandboxd)", tag: "code",
			description: "Starts a kernel of the language in the directory (a few seconds: the answer waits for it). 400 when the sandbox has no kernel for the language.",
			body:        contract.CodeContextRequest{}, ok: contract.CodeContextResponse{}, handler: s.createCodeContext},
		{method: http.MethodPost, path: "/api/sandboxes/{id}/code/contexts/{contextId}/restart", summary: "Restart a code context's kernel: same id, no state (sandboxd)", tag: "code",
			description: "An execution running in it ends with the error ContextRestarting.",
			query:       contract.AccountRequest{}, ok: contract.StatusResponse{}, handler: s.restartCodeContext},
		{method: http.MethodDelete, path: "/api/sandboxes/{id}/code/contexts/{contextId}", summary: "Stop a code context's kernel and forget it (sandboxd)", tag: "code",
			query: contract.AccountRequest{}, ok: contract.StatusResponse{}, handler: s.removeCodeContext},
		{method: http.MethodGet, path: "/api/sandboxes/{id}/processes", summary: "List the processes running in a sandbox (sandboxd)", tag: "sandboxes",
			description: "The processes exec and runs started that still run, including those whose caller went away (they outlive their connection and a restart of sandboxd).",
			query:       contract.AccountRequest{}, ok: contract.ProcessesResponse{}, handler: s.processes},
		{method: http.MethodDelete, path: "/api/sandboxes/{id}/processes/{pid}", summary: "Kill a process of a sandbox and everything it started (sandboxd)", tag: "sandboxes",
			query: contract.KillQuery{}, ok: contract.StatusResponse{}, handler: s.killProcess},
		{method: http.MethodGet, path: "/api/sandboxes/{id}/proxy/{port}/*", summary: "Reach a port of a sandbox (any method; websockets pass through)", tag: "sandboxes",
			description: "Forwards the request to the port inside a sandbox with a network (sandboxd). Authenticated like every route; the sandboxd credentials are not forwarded.",
			anyMethod:   true, handler: s.proxy},
		{method: http.MethodPost, path: "/api/templates", summary: "Build a template from an OCI image (sandboxd)", tag: "templates",
			description: "Records the template (building) and builds it in the background: the image is resolved, pinned by its manifest's digest and unpacked into the server's cache (once per digest). Answers 202 with the template; GET /api/templates/{id} follows the build (status, log, failure reason). The image may come with steps or a Dockerfile, start and ready commands, and the credentials of its registry (registry: kept sealed until the build has pulled the image, never answered); COPY and ADD read uploaded build files (PUT /api/templates/files/{hash}): a step's filesHash, a Dockerfile's context; files not uploaded are 400. Or fromTemplate is the base (another ready template, with steps; 409 while it builds, 400 when it failed, 404 for another account's). 409 when the account has a template of that name and tag.",
			body:        contract.BuildTemplateRequest{}, ok: contract.TemplateResponse{}, accepted: true, conflict: "The account has a template of that name and tag", handler: s.buildTemplate},
		{method: http.MethodPut, path: "/api/templates/files/{hash}", summary: "Upload build files for COPY steps: a tar archive, or a gzipped one (sandboxd)", tag: "templates",
			description: "Stores the body, a tar archive (gzip is recognised by its first bytes), as the account's build files named hash (64 lower-case hex digits; the CLI uses the archive's SHA-256, E2B's SDK its filesHash), replacing an earlier upload of that name. A Dockerfile's build names it in context, a COPY step in filesHash. Every entry is checked as it arrives: 400 for an entry outside the archive (an absolute name, ..), a link that leaves it, a device node or a named pipe, or a body that is not a tar; 413 over the server's upload bound (--templates-max-upload-mib, default 512 MiB), 100,000 entries or four times the bound unpacked. Nothing is stored when the archive is refused.",
			rawBody:     tarType, ok: contract.TemplateFilesResponse{}, handler: s.putTemplateFiles},
		{method: http.MethodGet, path: "/api/templates/files/{hash}", summary: "Whether the account has uploaded build files under a hash (sandboxd)", tag: "templates",
			description: "present is false (200) when the account has no archive of that hash, or it was collected since.",
			ok:          contract.TemplateFilesResponse{}, handler: s.getTemplateFiles},
		{method: http.MethodGet, path: "/api/templates", summary: "List the account's templates and the public ones (sandboxd)", tag: "templates",
			ok: contract.TemplatesResponse{}, handler: s.listTemplates},
		{method: http.MethodGet, path: "/api/templates/{id}", summary: "Get a template with its build's status, log and failure reason (sandboxd)", tag: "templates",
			description: "A template of another account is 404.",
			ok:          contract.TemplateResponse{}, handler: s.getTemplate},
		{method: http.MethodGet, path: "/api/templates/{id}/logs", summary: "Follow a template's build log as Server-Sent Events (sandboxd)", tag: "templates",
			description: "text/event-stream: \"log\" events {\"data\"} carry the build log as it grows (what the server keeps first: its last 64 KiB), then one \"end\" event {\"status\", \"failureReason\"} once the build is ready or failed (at once for an ended build); \"error\" {\"error\",\"statusCode\"} when the template goes while it is followed. A template of another account is 404.",
			ok:          TemplateLogEnd{}, eventsOnly: true, handler: s.templateLog},
		{method: http.MethodDelete, path: "/api/templates/{id}", summary: "Delete a template (sandboxd)", tag: "templates",
			description: "Answers the template as it was. 409 while a running or paused sandbox started from it; 403 for a public template. The server's copy of its image goes when no other template names it.",
			ok:          contract.TemplateResponse{}, conflict: "Running or paused sandboxes started from the template", handler: s.deleteTemplate},
		{method: http.MethodPost, path: "/api/sandboxes/{id}/template", summary: "Save a running sandbox's files as a template (sandboxd)", tag: "templates",
			description: "Captures the sandbox's writable layer (its files now; not its memory or processes) and records it as a ready template of the sandbox's account, named name[:tag]; a sandbox from it starts with those files. Its base is the sandbox's: the template it started from (with that template's config and start and ready commands), or the built-in image with the account's snapshot layers it started from. 409 when the account has a template of that name and tag, or when the sandbox is not running; 400 for a fork, or on a backend that cannot run templates. Answers once the template is ready.",
			body:        contract.SaveTemplateRequest{}, ok: contract.TemplateResponse{}, conflict: "The account has a template of that name and tag, or the sandbox is not running", handler: s.saveTemplate},
		{method: http.MethodPost, path: "/api/tasks/coding-agent", summary: "Run a coding agent on a repository", tag: "runs",
			body: contract.CodingAgentRequest{}, ok: contract.RunResponse{}, handler: s.codingAgent},
	}
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, contract.HealthResponse{Status: "success", Version: s.opts.Version, Runtime: s.opts.Runtime, Degraded: s.opts.Degraded})
	return nil
}

func (s *Server) serveOpenAPI(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(s.openapi)
	return nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	// In a cluster the body may have to go on to the node placement
	// chooses: keep it (it is small: contract.MaxBodyBytes).
	raw, err := contract.ReadRaw(w, r)
	if err != nil {
		return err
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
	req, account, err := bindBody(s, w, r, contract.ParseCreateSandbox)
	if err != nil {
		return err
	}
	if s.opts.Sandboxes == nil {
		return errNotAvailable
	}
	c := caller(r)
	node, local, err := s.opts.Gate.Place(r.Context(), c, req.Network)
	if err != nil {
		return edge.Explained(err, "")
	}
	if !local {
		// The body goes on to the node placement chose.
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(raw)), int64(len(raw))
		s.opts.Gate.Forward(w, r, c, node, true)
		return nil
	}
	sb, runID, err := s.opts.Sandboxes.Create(r.Context(), account, req.Domain())
	if err != nil {
		e, shown := contract.CreateError(err)
		if !shown {
			s.log.ErrorContext(r.Context(), "create sandbox", "err", err, "account_id", account, "request_id", edge.RequestID(r.Context()))
		}
		return e
	}
	view := s.sandboxView(r.Context(), sb)
	view.RunID = runID
	writeJSON(w, http.StatusOK, contract.SandboxesResponse{Status: "success", Sandboxes: []contract.Sandbox{view}})
	return nil
}

// sandboxView renders a row as the contract's Sandbox object, with what
// the network of a running sandbox of this node carried so far.
func (s *Server) sandboxView(ctx context.Context, sb store.Sandbox) contract.Sandbox {
	view := contract.ViewSandbox(sb, s.opts.Now())
	if sb.Status != store.SandboxRunning || sb.Network == "" || s.opts.Sandboxes == nil {
		return view
	}
	tr, err := s.opts.Sandboxes.Traffic(ctx, principalIn(ctx), sb.ID)
	if err != nil {
		s.log.WarnContext(ctx, "read sandbox traffic", "sandbox_id", sb.ID, "err", err)
	} else if tr != nil {
		view.NetworkBytes = &contract.NetworkBytes{Sent: tr.TxBytes, Received: tr.RxBytes}
	}
	return view
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	q, account, err := bindQuery(s, w, r, contract.ParseListQuery)
	if err != nil {
		return err
	}
	ctx := r.Context()
	resp := contract.ListSandboxesResponse{Status: "success", Sandboxes: []contract.Sandbox{}}

	// Statuses, the environment row and the file tree are independent:
	// fetch them in parallel.
	var (
		wg       sync.WaitGroup
		rows     []store.Sandbox
		lastRuns map[string]string
		next     store.Cursor
		rowsErr  error
		env      store.Environment
		envErr   error
		tree     []contract.FileTreeEntry
		treeCut  bool
		repoURL  string
		filesErr error
	)
	wg.Go(func() {
		rows, next, rowsErr = s.sandboxRows(ctx, account, q)
		if rowsErr == nil && s.opts.Sandboxes != nil {
			rows = s.opts.Sandboxes.Live(ctx, rows)
		}
		if rowsErr == nil {
			lastRuns = s.latestRuns(ctx, rows)
		}
	})
	wg.Go(func() { env, envErr = s.opts.Store.GetEnvironment(ctx, account) })
	if s.opts.Files != nil {
		wg.Go(func() {
			repoURL, filesErr = s.opts.Files.RepoURL(ctx, account)
			if filesErr == nil && repoURL != "" {
				tree, treeCut, filesErr = s.opts.Files.Tree(ctx, account)
			}
		})
	}
	wg.Wait()
	if rowsErr != nil {
		return fmt.Errorf("list sandboxes of %s: %w", account, rowsErr)
	}
	if envErr != nil && !errors.Is(envErr, store.ErrNotFound) {
		return fmt.Errorf("get environment of %s: %w", account, envErr)
	}
	for _, sb := range rows {
		view := s.sandboxView(ctx, sb)
		view.RunID = lastRuns[sb.ID]
		resp.Sandboxes = append(resp.Sandboxes, view)
	}
	if envErr == nil && s.environmentLive(env) {
		resp.SnapshotID = env.SnapshotID // a filter matching nothing still answers the account's environment
		resp.GithubRepo = env.GithubRepo
	}
	if repoURL != "" && resp.GithubRepo == nil {
		resp.GithubRepo = &repoURL
	}
	if filesErr != nil {
		// The contract answers a null tree when listing fails.
		s.log.WarnContext(ctx, "list repository tree", "account_id", account, "err", filesErr)
	} else if tree != nil {
		resp.Filetree, resp.FiletreeTruncated = tree, treeCut
	}
	setNextCursor(w, next)
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// latestRuns maps each of rows to the id of its newest run, for the list's
// runId. Without them the list is still right, so a failure is logged and
// the list goes without.
func (s *Server) latestRuns(ctx context.Context, rows []store.Sandbox) map[string]string {
	ids := make([]string, len(rows))
	for i, sb := range rows {
		ids[i] = sb.ID
	}
	runs, err := s.opts.Store.LatestRunIDs(ctx, ids)
	if err != nil {
		s.log.WarnContext(ctx, "list the sandboxes' runs", "err", err)
	}
	return runs
}

// environmentLive reports whether the account's snapshot row has not expired.
func (s *Server) environmentLive(env store.Environment) bool {
	return env.ExpiresAt.After(s.opts.Now())
}

// snapshotRow renders the account's row, or nil (JSON null) while it has no
// snapshot: the published shape types snapshot_id as a string.
func snapshotRow(env store.Environment) *contract.SnapshotRow {
	if env.SnapshotID == nil || *env.SnapshotID == "" {
		return nil
	}
	return &contract.SnapshotRow{
		AccountID:  env.AccountID,
		SnapshotID: *env.SnapshotID,
		ExpiresAt:  contract.FormatTime(env.ExpiresAt),
		GithubRepo: env.GithubRepo,
		CreatedAt:  contract.FormatTime(env.CreatedAt),
	}
}

func (s *Server) patchSandboxes(w http.ResponseWriter, r *http.Request) error {
	req, account, err := bindBody(s, w, r, contract.ParsePatchSandboxes)
	if err != nil {
		return err
	}
	if s.opts.Environments == nil {
		return errNotAvailable
	}
	env, err := s.opts.Environments.PatchEnvironment(r.Context(), account, persist.EnvironmentPatch{SnapshotID: req.SnapshotID, GithubRepo: req.GithubRepo})
	if err != nil {
		return edge.Explained(err, "Snapshot not found")
	}
	// The raw row, never wrapped: the original's handler and its published
	// UpdateSnapshotResponse both answer it so (null while there is none).
	var row *contract.SnapshotRow
	if env != nil {
		row = snapshotRow(*env)
	}
	writeJSON(w, http.StatusOK, row)
	return nil
}

func (s *Server) setupSandbox(w http.ResponseWriter, r *http.Request) error {
	_, account, err := bindBody(s, w, r, contract.ParseAccountOnly)
	if err != nil {
		return err
	}
	if s.opts.Agents == nil {
		return errNotAvailable
	}
	runID, err := s.opts.Agents.Setup(r.Context(), account)
	if err != nil {
		return edge.Explained(err, "Not found")
	}
	writeJSON(w, http.StatusOK, contract.RunResponse{Status: "success", RunID: runID})
	return nil
}

func (s *Server) deleteSandboxes(w http.ResponseWriter, r *http.Request) error {
	_, account, err := bindBody(s, w, r, contract.ParseAccountOnly)
	if err != nil {
		return err
	}
	if s.opts.Sandboxes == nil {
		return errNotAvailable
	}
	env, err := s.opts.Sandboxes.DeleteEnvironment(r.Context(), account)
	if err != nil {
		return edge.Explained(err, "Not found")
	}
	resp := contract.DeleteSandboxesResponse{Status: "success"}
	if env != nil {
		resp.DeletedSnapshot = snapshotRow(*env)
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func (s *Server) uploadFiles(w http.ResponseWriter, r *http.Request) error {
	// Uploads act for the key's own account only.
	account := principal(r).AccountID
	var (
		uploaded []contract.UploadedFile
		failures []string
		err      error
	)
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "multipart/form-data" {
		if s.opts.Files == nil {
			return errNotAvailable
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxMultipartBytes)
		mr, merr := r.MultipartReader()
		if merr != nil {
			return contract.BadRequest("Request body must be valid multipart/form-data")
		}
		uploaded, failures, err = s.opts.Files.UploadMultipart(r.Context(), account, mr)
	} else {
		var o contract.Args
		if o, err = contract.ReadArgs(w, r); err != nil {
			return err
		}
		var req contract.UploadFilesRequest
		if req, err = contract.ParseUploadFiles(o); err != nil {
			return err
		}
		if s.opts.Files == nil {
			return errNotAvailable
		}
		uploaded, failures, err = s.opts.Files.Upload(r.Context(), account, req.Domain())
	}
	if err != nil {
		return edge.Explained(err, "Not found")
	}
	if len(uploaded) == 0 {
		return contract.BadRequest("All uploads failed: " + strings.Join(failures, "; "))
	}
	writeJSON(w, http.StatusOK, contract.UploadFilesResponse{Status: "success", Uploaded: uploaded, Errors: failures})
	return nil
}

// maxMultipartBytes bounds a multipart upload's body (1 GiB of files and
// some room for the form's framing).
const maxMultipartBytes = 1<<30 + 1<<20

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) error {
	q, account, err := bindQuery(s, w, r, contract.ParseFileQuery)
	if err != nil {
		return err
	}
	if s.opts.Files == nil {
		return errNotAvailable
	}
	data, err := s.opts.Files.Read(r.Context(), account, q.Path)
	if err != nil {
		return edge.Explained(err, "File not found in repository")
	}
	resp := contract.FileResponse{Status: "success"}
	if contract.IsBinary(q.Path, data) {
		resp.Content, resp.Encoding = base64.StdEncoding.EncodeToString(data), "base64"
	} else {
		resp.Content = string(data)
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) error {
	q, account, err := bindQuery(s, w, r, contract.ParseRunsQuery)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if q.RunID != "" {
		run, err := s.opts.Gate.Run(ctx, caller(r), q.RunID, q.AccountID)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, contract.RunsResponse{Status: "success", Runs: []contract.Run{contract.ViewRun(run, s.opts.Now())}})
		return nil
	}
	runs, next, err := s.runRows(ctx, account, q)
	if err != nil {
		return fmt.Errorf("list runs of %s: %w", account, err)
	}
	resp := contract.RunsResponse{Status: "success", Runs: make([]contract.Run, 0, len(runs))}
	for _, run := range runs {
		resp.Runs = append(resp.Runs, contract.ViewRun(run, s.opts.Now()))
	}
	setNextCursor(w, next)
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func (s *Server) stopSandbox(w http.ResponseWriter, r *http.Request) error {
	return actOnSandbox(s, w, r, contract.ParseAccountOnly, func(ctx context.Context, sb store.Sandbox, _ contract.AccountRequest) (store.Sandbox, error) {
		return s.opts.Sandboxes.Stop(ctx, principal(r), sb.ID)
	})
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	return actOnSandbox(s, w, r, contract.ParseTimeout, func(ctx context.Context, sb store.Sandbox, req contract.TimeoutRequest) (store.Sandbox, error) {
		return s.opts.Sandboxes.SetTimeout(ctx, principal(r), sb.ID, time.Duration(req.Timeout)*time.Millisecond)
	})
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	return actOnSandbox(s, w, r, contract.ParsePause, func(ctx context.Context, sb store.Sandbox, req contract.PauseRequest) (store.Sandbox, error) {
		if req.Memory != nil && !*req.Memory {
			return s.opts.Sandboxes.PauseFiles(ctx, principal(r), sb.ID)
		}
		return s.opts.Sandboxes.Pause(ctx, principal(r), sb.ID)
	})
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) error {
	return actOnSandbox(s, w, r, contract.ParseAccountOnly, func(ctx context.Context, sb store.Sandbox, _ contract.AccountRequest) (store.Sandbox, error) {
		return s.opts.Sandboxes.Resume(ctx, principal(r), sb.ID)
	})
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) error {
	req, sb, err := bindSandbox(s, w, r, contract.ParseFork)
	if err != nil {
		return err
	}
	kids, err := s.opts.Sandboxes.Fork(r.Context(), principal(r), sb.ID, req.Count, time.Duration(req.Timeout)*time.Millisecond)
	if err != nil {
		return edge.Explained(err, "Sandbox not found")
	}
	resp := contract.SandboxesResponse{Status: "success", Sandboxes: make([]contract.Sandbox, len(kids))}
	for i, k := range kids {
		resp.Sandboxes[i] = s.sandboxView(r.Context(), k)
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) error {
	return actOnSandbox(s, w, r, contract.ParseNetworkChange, func(ctx context.Context, sb store.Sandbox, req contract.NetworkRequest) (store.Sandbox, error) {
		return s.opts.Sandboxes.SetNetwork(ctx, principal(r), sb.ID, req.Network)
	})
}

// bindSandbox is the start of a route on one sandbox with a JSON body:
// decode, validate, authorise (the sandbox the caller may act on).
func bindSandbox[T contract.ActsFor](s *Server, w http.ResponseWriter, r *http.Request, parse func(contract.Args) (T, error)) (T, store.Sandbox, error) {
	req, err := readBody(w, r, parse)
	if err != nil {
		return req, store.Sandbox{}, err
	}
	sb, err := s.sandboxFor(r, req.ActingFor())
	if err != nil {
		return req, sb, err
	}
	if s.opts.Sandboxes == nil {
		return req, sb, errNotAvailable
	}
	return req, sb, nil
}

// actOnSandbox is the shared shape of the routes that change one sandbox:
// decode, validate, authorise, act, answer the sandbox.
func actOnSandbox[T contract.ActsFor](s *Server, w http.ResponseWriter, r *http.Request, parse func(contract.Args) (T, error), act func(context.Context, store.Sandbox, T) (store.Sandbox, error)) error {
	req, sb, err := bindSandbox(s, w, r, parse)
	if err != nil {
		return err
	}
	sb, err = act(r.Context(), sb, req)
	if err != nil {
		return edge.Explained(err, "Sandbox not found")
	}
	writeJSON(w, http.StatusOK, contract.SandboxResponse{Status: "success", Sandbox: s.sandboxView(r.Context(), sb)})
	return nil
}

func (s *Server) ports(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandboxOfQuery(r)
	if err != nil {
		return err
	}
	ports, err := s.opts.Sandboxes.Ports(r.Context(), principal(r), sb.ID)
	if err != nil {
		return edge.Explained(err, "Sandbox not found")
	}
	resp := contract.PortsResponse{Status: "success", Ports: make([]contract.Port, 0, len(ports))}
	for _, p := range ports {
		resp.Ports = append(resp.Ports, contract.Port{Port: p, URL: fmt.Sprintf("/api/sandboxes/%s/proxy/%d/", sb.ID, p)})
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func (s *Server) proxy(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.sandboxFor(r, ""); err != nil {
		return err
	}
	if s.opts.Proxy == nil {
		return errNotAvailable
	}
	s.opts.Proxy.ServeHTTP(w, r)
	return nil
}

func (s *Server) codingAgent(w http.ResponseWriter, r *http.Request) error {
	req, account, err := bindBody(s, w, r, contract.ParseCodingAgent)
	if err != nil {
		return err
	}
	if s.opts.Agents == nil {
		return errNotAvailable
	}
	runID, err := s.opts.Agents.CodingAgent(r.Context(), account, req.Domain())
	if err != nil {
		return edge.Explained(err, "Not found")
	}
	writeJSON(w, http.StatusOK, contract.RunResponse{Status: "success", RunID: runID})
	return nil
}
