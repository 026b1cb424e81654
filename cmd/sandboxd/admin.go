package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/agents"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// newAdminCmd groups the operator commands. They open the same database as
// `serve` (safe while it runs) and print tables, or JSON with --json.
func newAdminCmd(g *globals) *cobra.Command {
	admin := &cobra.Command{Use: "admin", Short: "Manage accounts, organizations, API keys, the nodes of a cluster and their certificates"}
	account := &cobra.Command{Use: "account", Short: "Manage accounts"}
	org := &cobra.Command{Use: "org", Short: "Manage organization membership"}
	key := &cobra.Command{Use: "key", Short: "Manage API keys"}
	account.AddCommand(newAccountCreateCmd(g), newAccountListCmd(g), newAccountSetupCmd(g))
	org.AddCommand(newOrgAddMemberCmd(g), newOrgRemoveMemberCmd(g), newOrgShareCmd(g))
	key.AddCommand(newKeyCreateCmd(g), newKeyListCmd(g), newKeyRevokeCmd(g))
	admin.AddCommand(account, org, key, newAdminNodeCmd(g), newAdminClusterCertCmd(), newAdminTemplateCmd(g))
	return admin
}

func newAccountCreateCmd(g *globals) *cobra.Command {
	var name, slug string
	var isOrg, asJSON bool
	cmd := &cobra.Command{
		Use:   "create --name NAME [--org]",
		Short: "Create a personal account or an organization",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return fmt.Errorf("--name is required")
			}
			st, err := g.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer st.Close()
			a := store.Account{Name: name, Slug: slug, Kind: store.AccountPersonal}
			if isOrg {
				a.Kind = store.AccountOrg
			}
			if err := st.CreateAccount(cmd.Context(), &a); err != nil {
				return fmt.Errorf("create account %q: %w", name, err)
			}
			return printAccounts(cmd.OutOrStdout(), asJSON, false, []store.Account{a})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "account name")
	cmd.Flags().StringVar(&slug, "slug", "", "URL-safe short name (default derived from --name)")
	cmd.Flags().BoolVar(&isOrg, "org", false, "create an organization")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newAccountListCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List accounts",
		Args:  cobra.NoArgs,
		RunE: g.withStore(func(cmd *cobra.Command, _ []string, st *store.Store) error {
			accts, err := st.ListAccounts(cmd.Context())
			if err != nil {
				return fmt.Errorf("list accounts: %w", err)
			}
			return printAccounts(cmd.OutOrStdout(), asJSON, true, accts)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printAccounts prints one account as an object or many as an array.
func printAccounts(w io.Writer, asJSON, many bool, accts []store.Account) error {
	if asJSON {
		if many {
			if accts == nil {
				accts = []store.Account{}
			}
			return printJSON(w, accts)
		}
		return printJSON(w, accts[0])
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tNAME\tSLUG\tCREATED")
	for _, a := range accts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.ID, a.Kind, a.Name, a.Slug, a.CreatedAt.Format(time.RFC3339))
	}
	return tw.Flush()
}

func newAccountSetupCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "setup ACCOUNT_ID",
		Short: "Queue the setup-sandbox task for an account (README, organization submodules, first snapshot)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			st, err := g.openStore(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			if _, err := st.GetAccount(ctx, args[0]); err != nil {
				return fmt.Errorf("account %s: %w", args[0], err)
			}
			jc, err := jobs.New(ctx, st, jobs.Config{PostgresDSN: g.database, Logger: g.logger(os.Stderr)})
			if err != nil {
				return err
			}
			defer jc.Close()
			runID, _, err := agents.EnqueueSetup(ctx, st, jc, nil, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), map[string]string{"runId": runID, "account_id": args[0]})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "queued %s (setup-sandbox); a running server works it: GET /api/tasks/runs?runId=%s\n", runID, runID)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newOrgAddMemberCmd(g *globals) *cobra.Command {
	return newOrgMemberCmd(g, "add-member", "Make a personal account a member of an organization", "added %s to %s",
		func(ctx context.Context, st *store.Store, org, account string) error {
			if err := st.AddOrgMember(ctx, org, account); err != nil {
				return fmt.Errorf("add %s to organization %s: %w", account, org, err)
			}
			return nil
		})
}

func newOrgRemoveMemberCmd(g *globals) *cobra.Command {
	return newOrgMemberCmd(g, "remove-member", "Remove a member from an organization", "removed %s from %s",
		func(ctx context.Context, st *store.Store, org, account string) error {
			if err := st.RemoveOrgMember(ctx, org, account); err != nil {
				return fmt.Errorf("remove %s from organization %s: %w", account, org, err)
			}
			return nil
		})
}

// newOrgMemberCmd is the shape of the membership commands: --org and
// --account, one change, one line saying what was done.
func newOrgMemberCmd(g *globals, name, short, done string, change func(ctx context.Context, st *store.Store, org, account string) error) *cobra.Command {
	var orgID, accountID string
	cmd := &cobra.Command{
		Use:   name + " --org ORG_ID --account ACCOUNT_ID",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: g.withStore(func(cmd *cobra.Command, _ []string, st *store.Store) error {
			if err := change(cmd.Context(), st, orgID, accountID); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), done+"\n", accountID, orgID)
			return nil
		}),
	}
	cmd.Flags().StringVar(&orgID, "org", "", "organization account id")
	cmd.Flags().StringVar(&accountID, "account", "", "member account id")
	_ = cmd.MarkFlagRequired("org")
	_ = cmd.MarkFlagRequired("account")
	return cmd
}

func newOrgShareCmd(g *globals) *cobra.Command {
	var orgID string
	var share bool
	cmd := &cobra.Command{
		Use:   "share-access --org ORG_ID [--enabled=true|false]",
		Short: "Let members of an organization act for one another",
		Args:  cobra.NoArgs,
		RunE: g.withStore(func(cmd *cobra.Command, _ []string, st *store.Store) error {
			if err := st.SetMembersShareAccess(cmd.Context(), orgID, share); err != nil {
				return fmt.Errorf("set member access of %s: %w", orgID, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "members of %s share access: %t\n", orgID, share)
			return nil
		}),
	}
	cmd.Flags().StringVar(&orgID, "org", "", "organization account id")
	cmd.Flags().BoolVar(&share, "enabled", true, "whether members may act for one another")
	_ = cmd.MarkFlagRequired("org")
	return cmd
}

// createdKey is what `key create` prints: the only time the plaintext is
// shown.
type createdKey struct {
	ID        string     `json:"id"`
	Key       string     `json:"key"`
	AccountID string     `json:"account_id"`
	Name      string     `json:"name,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

func newKeyCreateCmd(g *globals) *cobra.Command {
	var accountID, name, format string
	var expires time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create --account ID [--name N] [--format sandboxd|e2b]",
		Short: "Create an API key (its plaintext is printed once, here)",
		Args:  cobra.NoArgs,
		RunE: g.withStore(func(cmd *cobra.Command, _ []string, st *store.Store) error {
			if _, err := st.GetAccount(cmd.Context(), accountID); err != nil {
				return fmt.Errorf("account %s: %w", accountID, err)
			}
			k, plaintext, err := newAPIKey(accountID, name, format, expires)
			if err != nil {
				return err
			}
			if err := st.CreateAPIKey(cmd.Context(), &k); err != nil {
				return fmt.Errorf("create key: %w", err)
			}
			out := createdKey{ID: k.ID, Key: plaintext, AccountID: k.AccountID, Name: k.Name, ExpiresAt: k.ExpiresAt}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "ID\t%s\nACCOUNT\t%s\nKEY\t%s\n", out.ID, out.AccountID, out.Key)
			fmt.Fprintln(tw, "\nStore the key now: it is not shown again.")
			return tw.Flush()
		}),
	}
	cmd.Flags().StringVar(&accountID, "account", "", "account id the key belongs to")
	cmd.Flags().StringVar(&name, "name", "", "a label for the key")
	cmd.Flags().DurationVar(&expires, "expires-in", 0, "expire the key after this long (e.g. 720h); 0 never expires")
	cmd.Flags().StringVar(&format, "format", "sandboxd", `the key's look: "sandboxd" (sbx_...) or "e2b" (e2b_ and hex, which every E2B SDK accepts); both work everywhere`)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	_ = cmd.MarkFlagRequired("account")
	return cmd
}

// newAPIKey mints a key row and its plaintext in format ("sandboxd" or
// "e2b").
func newAPIKey(accountID, name, format string, expires time.Duration) (store.APIKey, string, error) {
	mint := auth.NewKey
	switch format {
	case "sandboxd", "":
	case "e2b":
		mint = auth.NewE2BKey
	default:
		return store.APIKey{}, "", fmt.Errorf(`--format %q: want "sandboxd" or "e2b"`, format)
	}
	plaintext, prefix, hash, err := mint()
	if err != nil {
		return store.APIKey{}, "", err
	}
	k := store.APIKey{AccountID: accountID, Name: name, Prefix: prefix, Hash: hash}
	if expires > 0 {
		t := time.Now().Add(expires).UTC()
		k.ExpiresAt = &t
	}
	return k, plaintext, nil
}

func newKeyListCmd(g *globals) *cobra.Command {
	var accountID string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [--account ID]",
		Short: "List API keys (never their plaintext)",
		Args:  cobra.NoArgs,
		RunE: g.withStore(func(cmd *cobra.Command, _ []string, st *store.Store) error {
			keys, err := st.ListAPIKeys(cmd.Context(), accountID)
			if err != nil {
				return fmt.Errorf("list keys: %w", err)
			}
			if asJSON {
				if keys == nil {
					keys = []store.APIKey{}
				}
				return printJSON(cmd.OutOrStdout(), keys)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tACCOUNT\tPREFIX\tNAME\tSTATE\tCREATED")
			for _, k := range keys {
				state := "active"
				switch {
				case k.RevokedAt != nil:
					state = "revoked"
				case k.ExpiresAt != nil && !time.Now().Before(*k.ExpiresAt):
					state = "expired"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s…\t%s\t%s\t%s\n", k.ID, k.AccountID, k.Prefix, k.Name, state, k.CreatedAt.Format(time.RFC3339))
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().StringVar(&accountID, "account", "", "only keys of this account")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newKeyRevokeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an API key at once",
		Args:  cobra.ExactArgs(1),
		RunE: g.withStore(func(cmd *cobra.Command, args []string, st *store.Store) error {
			if err := st.RevokeAPIKey(cmd.Context(), args[0], time.Now()); err != nil {
				return fmt.Errorf("revoke key %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s\n", args[0])
			return nil
		}),
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
