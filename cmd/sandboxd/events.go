package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// eventsPoll is how often `sandboxd events --follow` asks for new events
// (a variable for the tests).
var eventsPoll = time.Second

// newEventsCmd is `sandboxd events`: the account's lifecycle events
// (GET /api/events), newest first, or followed as they come.
func newEventsCmd() *cobra.Command {
	c := &apiClient{http: newAPIHTTPClient()}
	f := &clientFlags{}
	var sandboxID, types string
	var limit int
	var follow bool
	cmd := &cobra.Command{
		Use:   "events [--sandbox ID] [--type T,...] [--limit N] [--follow]",
		Short: "List the account's lifecycle events (created, running, paused, resumed, stopped, failed, ...)",
		Long: "List the account's lifecycle events, newest first: each change of its sandboxes (sandbox.created,\n" +
			"sandbox.running, sandbox.paused, sandbox.resumed, sandbox.updated, sandbox.snapshot, run.finished,\n" +
			"sandbox.stopped, sandbox.failed with its reason). --follow prints the events after the newest one as\n" +
			"they come, oldest first, until interrupted. --json prints the API's event objects (one per line with\n" +
			"--follow).",
		Example: "  sandboxd events --sandbox sbx_123\n" +
			"  sandboxd events --type sandbox.failed,sandbox.stopped --limit 20\n" +
			"  sandboxd events --follow --json | jq -r .type",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			params := client.GetEventsParams{AccountID: optional(f.account), SandboxID: optional(sandboxID), Type: optional(types), Limit: &limit}
			events, _, err := c.events(cmd.Context(), params)
			if err != nil {
				return err
			}
			if !follow {
				if f.asJSON {
					return printJSON(cmd.OutOrStdout(), events)
				}
				return printEvents(cmd.OutOrStdout(), events, true)
			}
			return c.followEvents(cmd, params, events, f.asJSON)
		},
	}
	registerAPIFlags(cmd, c, f, true)
	cmd.Flags().StringVar(&sandboxID, "sandbox", "", "only this sandbox's events")
	cmd.Flags().StringVar(&types, "type", "", "only events of these types, comma-separated")
	cmd.Flags().IntVar(&limit, "limit", 50, "at most this many (1 to 100)")
	cmd.Flags().BoolVar(&follow, "follow", false, "print new events as they come, until interrupted")
	return cmd
}

// events is one page of GET /api/events and the next page's cursor.
func (c *apiClient) events(ctx context.Context, params client.GetEventsParams) ([]client.Event, string, error) {
	cl, err := c.api()
	if err != nil {
		return nil, "", err
	}
	res, err := client.Check(cl.GetEventsWithResponse(ctx, &params))
	if err != nil {
		return nil, "", err
	}
	out, err := decoded(res.JSON200)
	if err != nil {
		return nil, "", err
	}
	return out.Events, res.HTTPResponse.Header.Get("X-Next-Cursor"), nil
}

// followEvents prints seen (newest first) oldest first, then each new
// event as it comes: polled every eventsPoll, oldest first, from a second
// before the last one printed (events of one millisecond may be listed in
// any id order), skipping those already printed.
func (c *apiClient) followEvents(cmd *cobra.Command, params client.GetEventsParams, seen []client.Event, asJSON bool) error {
	out := cmd.OutOrStdout()
	printed := map[string]time.Time{}
	since := time.Now().Add(-time.Second)
	show := func(e client.Event) error {
		t, err := time.Parse(time.RFC3339Nano, e.CreatedAt)
		if err != nil {
			t = time.Now()
		}
		printed[e.ID] = t
		if t.After(since.Add(time.Second)) {
			since = t.Add(-time.Second)
		}
		return printEvent(out, e, asJSON)
	}
	for i := len(seen) - 1; i >= 0; i-- {
		if err := show(seen[i]); err != nil {
			return err
		}
	}
	asc := client.GetEventsParamsOrder("asc")
	params.Order, params.Limit = &asc, optional(100)
	tick := time.NewTicker(eventsPoll)
	defer tick.Stop()
	for {
		select {
		case <-cmd.Context().Done():
			return nil
		case <-tick.C:
		}
		params.Cursor = nil
		from := since.UTC().Format(time.RFC3339Nano)
		params.Since = &from
		for {
			page, next, err := c.events(cmd.Context(), params)
			if err != nil {
				if cmd.Context().Err() != nil {
					return nil
				}
				return err
			}
			for _, e := range page {
				if _, done := printed[e.ID]; done {
					continue
				}
				if err := show(e); err != nil {
					return err
				}
			}
			if next == "" {
				break
			}
			params.Cursor = &next
		}
		for id, t := range printed {
			if t.Before(since.Add(-time.Minute)) {
				delete(printed, id) // never listed again
			}
		}
	}
}

// printEvent prints one event: a JSON line, or a table row.
func printEvent(w io.Writer, e client.Event, asJSON bool) error {
	if asJSON {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	return printEvents(w, []client.Event{e}, false)
}

// printEvents prints events as a table (with its header when asked).
func printEvents(w io.Writer, events []client.Event, header bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if header {
		fmt.Fprintln(tw, "TIME\tTYPE\tSANDBOX\tDATA")
	}
	for _, e := range events {
		data := ""
		if e.Data != nil {
			var parts []string
			for k, v := range *e.Data {
				parts = append(parts, fmt.Sprintf("%s=%v", k, v))
			}
			slices.Sort(parts)
			data = strings.Join(parts, " ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.CreatedAt, e.Type, e.SandboxID, data)
	}
	return tw.Flush()
}

// newWebhookCmd is `sandboxd webhook add|ls|rm|enable|disable|deliveries`.
func newWebhookCmd() *cobra.Command {
	c := &apiClient{http: newAPIHTTPClient()}
	f := &clientFlags{}
	cmd := &cobra.Command{Use: "webhook", Short: "Register, list and delete webhooks that get the account's lifecycle events"}
	registerAPIFlags(cmd, c, f, true)

	var name, events string
	var secretStdin bool
	add := &cobra.Command{
		Use:   "add URL [--name N] [--events T,...] [--secret-stdin]",
		Short: "Register a webhook: each event is POSTed to URL, signed (Sandboxd-Signature)",
		Long: "Register a webhook of the account: each event it takes (--events; all by default) is POSTed to URL as\n" +
			"JSON, signed with its secret (Sandboxd-Signature: v1= and the hex HMAC-SHA256 of Sandboxd-Timestamp, '.',\n" +
			"and the body), retried with backoff when it does not answer 2xx. The secret is read from stdin with\n" +
			"--secret-stdin, else made by the server; it is printed once, here.",
		Example: "  sandboxd webhook add https://hooks.example.com/sandboxd --events sandbox.failed,sandbox.stopped\n" +
			"  printf %s \"$SECRET\" | sandboxd webhook add https://hooks.example.com/in --secret-stdin --json",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := client.WebhookRequest{URL: &args[0], Name: optional(name), AccountID: optional(f.account)}
			if events != "" {
				list := strings.Split(events, ",")
				body.Events = &list
			}
			if secretStdin {
				b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 4096))
				if err != nil {
					return fmt.Errorf("--secret-stdin: %w", err)
				}
				s := strings.TrimRight(string(b), "\r\n")
				body.Secret = &s
			}
			cl, err := c.api()
			if err != nil {
				return err
			}
			res, err := client.Check(cl.PostWebhooksWithResponse(cmd.Context(), body))
			if err != nil {
				return err
			}
			out, err := decoded(res.JSON200)
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(cmd.OutOrStdout(), out)
			}
			if err := printWebhooks(cmd.OutOrStdout(), []client.Webhook{out.Webhook}); err != nil {
				return err
			}
			if out.Secret != nil && !secretStdin {
				fmt.Fprintf(cmd.OutOrStdout(), "secret: %s (shown once)\n", *out.Secret)
			}
			return nil
		},
	}
	add.Flags().StringVar(&name, "name", "", "a name for it")
	add.Flags().StringVar(&events, "events", "", "the event types it takes, comma-separated (default: all)")
	add.Flags().BoolVar(&secretStdin, "secret-stdin", false, "read the signing secret (16 to 512 bytes) from stdin instead of having one made")

	ls := &cobra.Command{
		Use:     "ls",
		Short:   "List the account's webhooks",
		Example: "  sandboxd webhook ls\n  sandboxd webhook ls --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			res, err := client.Check(cl.GetWebhooksWithResponse(cmd.Context(), &client.GetWebhooksParams{AccountID: optional(f.account)}))
			if err != nil {
				return err
			}
			out, err := decoded(res.JSON200)
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(cmd.OutOrStdout(), out.Webhooks)
			}
			return printWebhooks(cmd.OutOrStdout(), out.Webhooks)
		},
	}

	rm := &cobra.Command{
		Use:     "rm ID",
		Short:   "Delete a webhook (what it had not delivered is cancelled)",
		Example: "  sandboxd webhook rm whk_123",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			res, err := client.Check(cl.DeleteWebhooksIDWithResponse(cmd.Context(), args[0], &client.DeleteWebhooksIDParams{AccountID: optional(f.account)}))
			if err != nil {
				return err
			}
			out, err := decoded(res.JSON200)
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(cmd.OutOrStdout(), out.Webhook)
			}
			fmt.Fprintln(cmd.OutOrStdout(), out.Webhook.ID)
			return nil
		},
	}

	toggle := func(verb string, on bool) *cobra.Command {
		return &cobra.Command{
			Use:     verb + " ID",
			Short:   strings.ToUpper(verb[:1]) + verb[1:] + " a webhook's deliveries",
			Example: "  sandboxd webhook " + verb + " whk_123",
			Args:    cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				cl, err := c.api()
				if err != nil {
					return err
				}
				res, err := client.Check(cl.PatchWebhooksIDWithResponse(cmd.Context(), args[0], client.WebhookRequest{Enabled: &on, AccountID: optional(f.account)}))
				if err != nil {
					return err
				}
				out, err := decoded(res.JSON200)
				if err != nil {
					return err
				}
				if f.asJSON {
					return printJSON(cmd.OutOrStdout(), out.Webhook)
				}
				return printWebhooks(cmd.OutOrStdout(), []client.Webhook{out.Webhook})
			},
		}
	}

	var limit int
	deliveries := &cobra.Command{
		Use:   "deliveries ID [--limit N]",
		Short: "A webhook's deliveries, newest first: status, attempts, the receiver's last answer",
		Example: "  sandboxd webhook deliveries whk_123\n" +
			"  sandboxd webhook deliveries whk_123 --json | jq '.[] | select(.status == \"failed\")'",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			res, err := client.Check(cl.GetWebhooksIDDeliveriesWithResponse(cmd.Context(), args[0], &client.GetWebhooksIDDeliveriesParams{AccountID: optional(f.account), Limit: &limit}))
			if err != nil {
				return err
			}
			out, err := decoded(res.JSON200)
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(cmd.OutOrStdout(), out.Deliveries)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EVENT\tSTATUS\tATTEMPTS\tANSWER\tERROR\tUPDATED")
			for _, d := range out.Deliveries {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", d.EventID, d.Status, d.Attempts, d.ResponseStatus, deref(d.LastError), d.UpdatedAt)
			}
			return tw.Flush()
		},
	}
	deliveries.Flags().IntVar(&limit, "limit", 20, "at most this many (1 to 100)")
	cmd.AddCommand(add, ls, rm, toggle("enable", true), toggle("disable", false), deliveries)
	return cmd
}

func printWebhooks(w io.Writer, list []client.Webhook) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tURL\tEVENTS\tENABLED\tFORMAT\tNAME")
	for _, wh := range list {
		events := "all"
		if len(wh.Events) > 0 {
			events = strings.Join(wh.Events, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\n", wh.ID, wh.URL, events, wh.Enabled, wh.Format, wh.Name)
	}
	return tw.Flush()
}
