package main

import "github.com/spf13/cobra"

// examples are the Example: sections of the commands that are not the API
// client's (whose examples sit with their definitions), by command path.
// They are kept here, apart from the commands, because those files belong
// to the server's parts (serve, admin, image, kernel, bench) and change
// with them; TestEveryCommandHasAnExample keeps the two in step.
var examples = map[string]string{
	"sandboxd serve": "  sandboxd serve\n" +
		"  sandboxd serve --listen 0.0.0.0:8080 --template base --keep-stopped-sandboxes 24h\n" +
		"  sandboxd serve --database postgres://sandboxd@db/sandboxd --blob-store s3://KEY:SECRET@s3:9000/sandboxd",
	"sandboxd admin account create": "  sandboxd admin account create --name alice --json\n" +
		"  sandboxd admin account create --name acme --org",
	"sandboxd admin account list":  "  sandboxd admin account list\n  sandboxd admin account list --json",
	"sandboxd admin account setup": "  sandboxd admin account setup 6f1c0c3e-1b7a-4b8e-9d3e-0c8a2b1d4e5f",
	"sandboxd admin key create": "  sandboxd admin key create --account 6f1c0c3e-1b7a-4b8e-9d3e-0c8a2b1d4e5f --json\n" +
		"  sandboxd admin key create --account 6f1c0c3e-1b7a-4b8e-9d3e-0c8a2b1d4e5f --expires-in 720h --format e2b",
	"sandboxd admin key list":          "  sandboxd admin key list\n  sandboxd admin key list --account 6f1c0c3e-1b7a-4b8e-9d3e-0c8a2b1d4e5f --json",
	"sandboxd admin key revoke":        "  sandboxd admin key list --account 6f1c0c3e-1b7a-4b8e-9d3e-0c8a2b1d4e5f   # its id\n  sandboxd admin key revoke 2d9f4a61-8c3b-4e0f-a7d2-5b1e9c6f3a08",
	"sandboxd admin org add-member":    "  sandboxd admin org add-member --org ORG_ID --account ACCOUNT_ID",
	"sandboxd admin org remove-member": "  sandboxd admin org remove-member --org ORG_ID --account ACCOUNT_ID",
	"sandboxd admin org share-access": "  sandboxd admin org share-access --org ORG_ID\n" +
		"  sandboxd admin org share-access --org ORG_ID --enabled=false",
	"sandboxd admin node ls":           "  sandboxd admin node ls --json",
	"sandboxd admin node cordon":       "  sandboxd admin node cordon 9b2e7c14-3f6a-4d85-b1c9-7e0a2f5d8c36   # an id of admin node ls",
	"sandboxd admin node uncordon":     "  sandboxd admin node uncordon 9b2e7c14-3f6a-4d85-b1c9-7e0a2f5d8c36   # an id of admin node ls",
	"sandboxd admin node drain":        "  sandboxd admin node drain 9b2e7c14-3f6a-4d85-b1c9-7e0a2f5d8c36   # an id of admin node ls",
	"sandboxd admin cluster-cert ca":   "  sandboxd admin cluster-cert ca --out /etc/sandboxd/ca",
	"sandboxd admin cluster-cert node": "  sandboxd admin cluster-cert node --ca /etc/sandboxd/ca --name node-b --address node-b.internal,10.0.0.12 --out /etc/sandboxd/tls",
	"sandboxd image build": "  sandboxd image build --template base\n" +
		"  sandboxd image build --template full --mirror http://deb.example.org/debian --force",
	"sandboxd image ls":        "  sandboxd image ls\n  sandboxd image ls --json",
	"sandboxd kernel build":    "  sandboxd kernel build\n  sandboxd kernel build --jobs 2 --json",
	"sandboxd kernel ls":       "  sandboxd kernel ls --json",
	"sandboxd kernel bench":    "  sandboxd kernel bench --iterations 10 --json",
	"sandboxd bench tti":       "  sudo sandboxd bench tti --busybox\n  sudo sandboxd bench tti --n 20 --chart tti.svg --json",
	"sandboxd bench code":      "  sudo sandboxd bench code\n  sudo sandboxd bench code --creates 10 --n 50 --json",
	"sandboxd bench exec":      "  sudo sandboxd bench exec\n  sudo sandboxd bench exec --n 100 --stream-mib 1024 --charts charts/ --json",
	"sandboxd bench density":   "  sudo sandboxd bench density --max 100",
	"sandboxd bench pause":     "  sudo sandboxd bench pause --iterations 10 --json",
	"sandboxd bench cluster":   "  sandboxd bench cluster --nodes 10 --database postgres://postgres@127.0.0.1/bench \\\n    --blob-store 's3://KEY:SECRET@127.0.0.1:9000/bucket/bench?tls=false' --json",
	"sandboxd bench workloads": "  sudo sandboxd bench workloads --rootfs ~/.cache/sandboxd/images/full-*/rootfs",
	"sandboxd mcp": "  sandboxd mcp --url https://sandboxd.example.org --key sbx_...\n" +
		"  sandboxd mcp --client claude-code",
	"sandboxd openapi":               "  sandboxd openapi -o api/openapi.json",
	"sandboxd completion bash":       "  source <(sandboxd completion bash)",
	"sandboxd completion zsh":        "  sandboxd completion zsh > \"${fpath[1]}/_sandboxd\"",
	"sandboxd completion fish":       "  sandboxd completion fish > ~/.config/fish/completions/sandboxd.fish",
	"sandboxd completion powershell": "  sandboxd completion powershell | Out-String | Invoke-Expression",
}

// addExamples gives each command of examples its Example, where it has
// none of its own.
func addExamples(root *cobra.Command) {
	walk(root, func(c *cobra.Command) {
		if ex, ok := examples[c.CommandPath()]; ok && c.Example == "" {
			c.Example = ex
		}
	})
}
