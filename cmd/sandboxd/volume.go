package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// Volumes (docs/API.md, "Volumes"): `sandboxd volume create|ls|inspect|rm|
// resize|fork` keeps the account's persistent volumes; `sandboxd sandbox
// create --volume NAME:/path[:ro]` mounts them.

// newVolumeCmd is `sandboxd volume create|ls|inspect|rm|resize|fork`. g
// gives the log format a fork's progress line follows.
func newVolumeCmd(g *globals) *cobra.Command {
	c := &apiClient{http: newAPIHTTPClient()}
	f := &clientFlags{}
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Create, list, inspect, grow, fork and delete persistent volumes that sandboxes mount",
		Long: "A volume is a persistent disk (ext4) of the account: `sandbox create --volume NAME:/path` mounts it, and its data\n" +
			"outlives every sandbox. One sandbox may have it read-write, or any number read-only (:ro).",
	}
	registerAPIFlags(cmd, c, f, true)

	var sizeMB int
	create := &cobra.Command{
		Use:   "create NAME [--size-mb N]",
		Short: "Create a volume (1024 MiB unless --size-mb says otherwise)",
		Long: "Create a volume of the account named NAME (letters, digits, '.', '_' and '-', starting with a letter or\n" +
			"digit). Its disk is made when a sandbox first mounts it. The server refuses a name the account has (409)\n" +
			"and a volume past the account's quota (429).",
		Example: "  sandboxd volume create data\n" +
			"  sandboxd volume create models --size-mb 20480 --json",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			res, err := client.Check(cl.PostVolumesWithResponse(cmd.Context(), client.CreateVolumeRequest{Name: args[0], SizeMb: optional(sizeMB), AccountID: optional(f.account)}))
			if err != nil {
				return err
			}
			return printVolumeAnswer(cmd.OutOrStdout(), res.JSON200, f.asJSON)
		},
	}
	create.Flags().IntVar(&sizeMB, "size-mb", 0, "size in MiB, at least 64 (default 1024)")

	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the account's volumes by name, with the sandboxes they are mounted in",
		Long: "List the account's volumes by name: each with its id, size, the sandboxes it is mounted in (SANDBOX:PATH,\n" +
			"with :ro for a read-only mount) and the volume it was forked from. --json prints the API's objects.",
		Example: "  sandboxd volume ls\n" +
			"  sandboxd volume ls --json | jq -r '.[].name'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vs, err := c.listVolumes(cmd.Context(), f.account)
			if err != nil {
				return err
			}
			return printVolumeList(cmd.OutOrStdout(), vs, f.asJSON, false)
		},
	}

	inspect := &cobra.Command{
		Use:     "inspect NAME|ID",
		Aliases: []string{"get"},
		Short:   "Show one volume",
		Example: "  sandboxd volume inspect data\n" +
			"  sandboxd volume get --json vol_123",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.volumeNames(f),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			res, err := client.Check(cl.GetVolumesNameWithResponse(cmd.Context(), args[0], &client.GetVolumesNameParams{AccountID: optional(f.account)}))
			if err != nil {
				return err
			}
			return printVolumeAnswer(cmd.OutOrStdout(), res.JSON200, f.asJSON)
		},
	}

	rm := &cobra.Command{
		Use:   "rm NAME|ID...",
		Short: "Delete volumes and their data (refused while a sandbox has one mounted)",
		Long: "Delete volumes of the account, and their data for good. The server refuses one a sandbox has mounted (409).\n" +
			"Prints each id deleted; the exit status is 1 when any was not.",
		Example: "  sandboxd volume rm data\n" +
			"  sandboxd volume rm --json scratch vol_123",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.volumeNames(f),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			return removeEach(cmd, args, f.asJSON, func(ref string) (client.Volume, string, error) {
				res, err := client.Check(cl.DeleteVolumesNameWithResponse(cmd.Context(), ref, &client.DeleteVolumesNameParams{AccountID: optional(f.account)}))
				if err != nil {
					return client.Volume{}, "", err
				}
				out, err := decoded(res.JSON200)
				if err != nil {
					return client.Volume{}, "", err
				}
				return out.Volume, out.Volume.ID, nil
			})
		},
	}

	var newSizeMB int
	resize := &cobra.Command{
		Use:   "resize NAME|ID --size-mb N",
		Short: "Grow a volume (never shrink it); its file system grows at its next mount",
		Long: "Grow the volume to --size-mb MiB. A volume only grows, and not while a sandbox has it mounted (409); its file\n" +
			"system grows when a sandbox next mounts it.",
		Example: "  sandboxd volume resize data --size-mb 4096\n" +
			"  sandboxd volume resize --json vol_123 --size-mb 10240",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.volumeNames(f),
		RunE: func(cmd *cobra.Command, args []string) error {
			if newSizeMB <= 0 {
				return &flagError{flags: []string{"size-mb"}, err: errors.New("--size-mb is required: the volume's new size in MiB")}
			}
			cl, err := c.api()
			if err != nil {
				return err
			}
			res, err := client.Check(cl.PatchVolumesNameWithResponse(cmd.Context(), args[0], client.ResizeVolumeRequest{SizeMb: newSizeMB, AccountID: optional(f.account)}))
			if err != nil {
				return err
			}
			return printVolumeAnswer(cmd.OutOrStdout(), res.JSON200, f.asJSON)
		},
	}
	resize.Flags().IntVar(&newSizeMB, "size-mb", 0, "the new size in MiB (no less than the volume's)")

	fork := &cobra.Command{
		Use:   "fork NAME|ID NEW_NAME",
		Short: "Copy a volume's data as it is now into a new volume",
		Long: "Make the account's volume NEW_NAME, of the same size, with the volume's data as it is now; the two are\n" +
			"independent from then on. Refused while a sandbox has the volume mounted read-write (409): its data is\n" +
			"changing. A volume a microVM wrote can be forked, and the fork too is for microVM sandboxes.",
		Example: "  sandboxd volume fork data data-before-upgrade\n" +
			"  sandboxd volume fork --json vol_123 experiment",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.volumeNames(f),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			waits := g.waitTracker(cmd.ErrOrStderr(), f.asJSON)
			out, err := waitFor(waits, "forking "+args[0], func() (*client.PostVolumesNameForkResult, error) {
				return client.Check(cl.PostVolumesNameForkWithResponse(cmd.Context(), args[0], client.ForkVolumeRequest{Name: args[1], AccountID: optional(f.account)}))
			})
			if err != nil {
				return err
			}
			return printVolumeAnswer(cmd.OutOrStdout(), out.JSON200, f.asJSON)
		},
	}
	cmd.AddCommand(create, ls, inspect, rm, resize, fork)
	return cmd
}

// listVolumes is GET /api/volumes.
func (c *apiClient) listVolumes(ctx context.Context, account string) ([]client.Volume, error) {
	cl, err := c.api()
	if err != nil {
		return nil, err
	}
	res, err := client.Check(cl.GetVolumesWithResponse(ctx, &client.GetVolumesParams{AccountID: optional(account)}))
	if err != nil {
		return nil, err
	}
	out, err := decoded(res.JSON200)
	if err != nil {
		return nil, err
	}
	return out.Volumes, nil
}

// volumeNames completes the account's volume names (the first argument
// only: the others are new names, or more volumes for rm).
func (c *apiClient) volumeNames(f *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if applyEnv(cmd.Flags(), os.LookupEnv) != nil || c.key == "" || len(args) > 0 && cmd.Name() != "rm" {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
		defer cancel()
		vs, err := c.listVolumes(ctx, f.account)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, v := range vs {
			if strings.HasPrefix(v.Name, toComplete) && !slices.Contains(args, v.Name) {
				out = append(out, cobra.CompletionWithDesc(v.Name, fmt.Sprintf("%d MiB, %s", v.SizeMb, attachedTo(v))))
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// printVolumeAnswer prints the volume of a route's answer.
func printVolumeAnswer(w io.Writer, res *client.VolumeResponse, asJSON bool) error {
	out, err := decoded(res)
	if err != nil {
		return err
	}
	return printVolumeList(w, []client.Volume{out.Volume}, asJSON, true)
}

// printVolumeList prints volumes as a table, or as JSON: the one object when
// one is asked for (single), else the array.
func printVolumeList(w io.Writer, list []client.Volume, asJSON, single bool) error {
	if asJSON {
		if single && len(list) == 1 {
			return printJSON(w, list[0])
		}
		return printJSON(w, list)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSIZE\tMOUNTED\tFORKED FROM\tCREATED")
	for _, v := range list {
		from := v.ForkedFrom
		if from == "" {
			from = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d MiB\t%s\t%s\t%s\n", v.ID, v.Name, v.SizeMb, attachedTo(v), from, v.CreatedAt)
	}
	return tw.Flush()
}

// attachedTo says where v is mounted: SANDBOX:PATH[:ro],... or "-".
func attachedTo(v client.Volume) string {
	if len(v.Attachments) == 0 {
		return "-"
	}
	var parts []string
	for _, a := range v.Attachments {
		p := a.SandboxID + ":" + a.Path
		if a.ReadOnly {
			p += ":ro"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ",")
}
