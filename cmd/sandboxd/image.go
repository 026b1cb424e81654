package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/image"
)

// newImageCmd is `sandboxd image`: building and listing the base images in
// the cache directory.
func newImageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build and list the base images sandboxes start from",
		Long: "Base images are root file systems built from Debian packages (and, for the full\n" +
			"template, the agent CLIs from the npm registry). They are cached by content in\n" +
			"<cache-dir>/images, shared by every data directory; serve builds its template\n" +
			"on start when it is missing.",
	}
	cmd.AddCommand(newImageBuildCmd(g), newImageLsCmd(g))
	return cmd
}

func newImageBuildCmd(g *globals) *cobra.Command {
	var (
		template string
		opts     image.BuildOptions
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Build a template's image unless it is cached",
		Long: "Build a template's image unless it is cached. Needs root (debootstrap, chroot)\n" +
			"and network access to a Debian mirror (by default the host's APT mirror).\n\nTemplates:\n" + imageTemplateHelp(),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tracker, log := g.progress(cmd.ErrOrStderr(), asJSON)
			store := image.NewStore(g.cacheDir, log)
			img, err := store.Build(cmd.Context(), template, opts, tracker)
			if err != nil {
				return err
			}
			if asJSON {
				return writeImageJSON(cmd.OutOrStdout(), img)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s, %d packages, built in %s\n%s\n",
				img.ID, humanize.IBytes(uint64(img.Size)), len(img.Packages),
				img.BuildDuration.Round(time.Second), img.Rootfs)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&template, "template", image.DefaultTemplate, "template to build: "+strings.Join(imageTemplateNames(), ", "))
	f.BoolVar(&opts.Force, "force", false, "rebuild even if the image is cached, replacing it")
	f.StringVar(&opts.Mirror, "mirror", "", "Debian mirror URL (default: the one in the host's APT sources)")
	f.BoolVar(&asJSON, "json", false, "print the built image as JSON")
	_ = cmd.RegisterFlagCompletionFunc("template", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return imageTemplateNames(), cobra.ShellCompDirectiveNoFileComp
	})
	return cmd
}

func newImageLsCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the images in the cache",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store := image.NewStore(g.cacheDir, g.logger(cmd.ErrOrStderr()))
			images, err := store.List(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if images == nil {
					images = []*image.Image{}
				}
				return writeImageJSON(cmd.OutOrStdout(), images)
			}
			return writeImageTable(cmd.OutOrStdout(), images, time.Now())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the images as a JSON array")
	return cmd
}

// writeImageTable prints one line per image; CONTENTS lists the template's
// headline packages with their versions.
func writeImageTable(w io.Writer, images []*image.Image, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTEMPLATE\tSIZE\tCREATED\tPACKAGES\tCONTENTS")
	for _, img := range images {
		var contents []string
		for _, p := range img.Highlights {
			contents = append(contents, p.Name+" "+shortDebVersion(p.Version))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", img.ID, img.Template,
			humanize.IBytes(uint64(img.Size)), humanize.RelTime(img.CreatedAt, now, "ago", "from now"),
			strconv.Itoa(len(img.Packages)), strings.Join(contents, ", "))
	}
	return tw.Flush()
}

// shortDebVersion drops a Debian version's epoch and revision ("1:2.39.5-0+deb12u2"
// becomes "2.39.5") to keep the table narrow; --json has the full versions.
func shortDebVersion(v string) string {
	if _, after, ok := strings.Cut(v, ":"); ok {
		v = after
	}
	if i := strings.LastIndexByte(v, '-'); i > 0 {
		v = v[:i]
	}
	return v
}

func imageTemplateNames() []string {
	var names []string
	for _, t := range image.Templates() {
		names = append(names, t.Name)
	}
	return names
}

func imageTemplateHelp() string {
	var b strings.Builder
	for _, t := range image.Templates() {
		fmt.Fprintf(&b, "  %-8s %s\n", t.Name, t.Description)
	}
	return b.String()
}

func writeImageJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
