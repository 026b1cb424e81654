package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// inspectCommand is `sandboxd sandbox inspect ID` (or get): everything the
// API says of one sandbox. The object is read as generic JSON, not into
// the generated client's type, so that a field the server adds shows here
// the day it is served, without a new CLI.
func inspectCommand(c *apiClient, f *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "inspect SANDBOX_ID",
		Aliases: []string{"get"},
		Short:   "Show every field the API answers for one sandbox (why it failed, its network, its run, ...)",
		Long: "Show every field the API answers for one sandbox, in the API's order: one per line, or as the API's\n" +
			"JSON object with --json. Stopped and failed sandboxes are shown until the server deletes them.",
		Example: "  sandboxd sandbox inspect sbx_123\n" +
			"  sandboxd sandbox get --json sbx_123 | jq -r .failureReason",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.sandboxIDs(f, false),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := c.sandboxObject(cmd.Context(), args[0], f.account)
			if err != nil {
				return err
			}
			if f.asJSON {
				var buf bytes.Buffer
				if err := json.Indent(&buf, raw, "", "  "); err != nil {
					return fmt.Errorf("decode answer: %w", err)
				}
				buf.WriteByte('\n')
				_, err := buf.WriteTo(cmd.OutOrStdout())
				return err
			}
			return printFields(cmd.OutOrStdout(), raw)
		},
	}
}

// sandboxObject is sandbox id as GET /api/sandboxes?sandbox_id= answers
// it: the JSON object, every field of it.
func (c *apiClient) sandboxObject(ctx context.Context, id, account string) (json.RawMessage, error) {
	cl, err := c.api()
	if err != nil {
		return nil, err
	}
	res, err := client.Check(cl.GetSandboxesWithResponse(ctx, &client.GetSandboxesParams{SandboxID: &id, AccountID: optional(account)}))
	if err != nil {
		return nil, err
	}
	var body struct {
		Sandboxes []json.RawMessage `json:"sandboxes"`
	}
	if err := json.Unmarshal(res.Body, &body); err != nil {
		return nil, fmt.Errorf("decode answer: %w", err)
	}
	for _, raw := range body.Sandboxes {
		var sb struct {
			SandboxID string `json:"sandboxId"`
		}
		if json.Unmarshal(raw, &sb) == nil && sb.SandboxID == id {
			return raw, nil
		}
	}
	return nil, sandboxNotFound()
}

// sandboxNotFound is the error for a sandbox the list does not have: the
// list answers a filter that matches nothing with no sandbox, as the
// original API did, and the caller is told what a route on it would.
func sandboxNotFound() error {
	return &client.Error{StatusCode: http.StatusNotFound, Body: client.ErrorBody{Status: client.ErrorBodyStatus("error"), Error: "Sandbox not found"}}
}

// printFields prints a JSON object's fields one per line in its own order:
// strings as they are, everything else as compact JSON, a timeout also as
// a duration.
func printFields(w io.Writer, raw json.RawMessage) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("decode answer: not a JSON object")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return fmt.Errorf("decode answer: %w", err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("decode answer: %w", err)
		}
		fmt.Fprintf(tw, "%s\t%s\n", key, fieldText(fmt.Sprint(key), v))
	}
	return tw.Flush()
}

// fieldText is how printFields shows one value.
func fieldText(key string, v json.RawMessage) string {
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s
	}
	var compact bytes.Buffer
	if json.Compact(&compact, v) != nil {
		return string(v)
	}
	var ms int64
	if key == "timeout" && json.Unmarshal(v, &ms) == nil {
		return fmt.Sprintf("%s (%v)", compact.String(), (time.Duration(ms) * time.Millisecond).Round(time.Second))
	}
	return compact.String()
}
