package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/cluster"
)

// The files `admin cluster-cert` writes, by role. A node's directory holds
// everything serve's --cluster-tls-* flags name; the CA's key stays where
// the CA was made.
const (
	caCertFile   = "ca.crt"
	caKeyFile    = "ca.key"
	nodeCertFile = "node.crt"
	nodeKeyFile  = "node.key"
)

// certInfo is what `admin cluster-cert` prints about what it made.
type certInfo struct {
	Name      string    `json:"name"`
	Cert      string    `json:"cert"`
	Key       string    `json:"key"`
	CA        string    `json:"ca,omitempty"`
	Addresses []string  `json:"addresses,omitempty"`
	NotAfter  time.Time `json:"not_after"`
	SHA256    string    `json:"sha256"`
}

// newAdminClusterCertCmd is `sandboxd admin cluster-cert ca|node`: the
// certificates of mutual TLS between nodes, without openssl.
func newAdminClusterCertCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster-cert",
		Short: "Make the CA and the node certificates for mutual TLS between the nodes of a cluster (--cluster-tls-*)",
	}
	cmd.AddCommand(newClusterCertCACmd(), newClusterCertNodeCmd())
	return cmd
}

func newClusterCertCACmd() *cobra.Command {
	var out, name string
	var days int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ca --out DIR",
		Short: "Make the cluster's CA: DIR/ca.crt for every node, DIR/ca.key (0600) to sign node certificates with, kept off the nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if days < 1 {
				return fmt.Errorf("--days %d: at least 1", days)
			}
			_, iss, err := cluster.NewCA(name, time.Now(), time.Duration(days)*24*time.Hour)
			if err != nil {
				return err
			}
			files, err := writeCertFiles(out, []certFile{
				{caKeyFile, iss.KeyPEM, 0o600},
				{caCertFile, iss.CertPEM, 0o644},
			})
			if err != nil {
				return err
			}
			info := certInfo{Name: name, Cert: files[1], Key: files[0], NotAfter: iss.Cert.NotAfter.UTC(), SHA256: cluster.Fingerprint(iss.Cert)}
			return printCertInfo(cmd.OutOrStdout(), asJSON, info,
				"Copy ca.crt to every node (--cluster-tls-ca). Keep ca.key safe and off the nodes: whoever has it can make node certificates.")
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "directory to write ca.crt and ca.key into (created 0700; existing files are not replaced)")
	f.StringVar(&name, "name", "sandboxd cluster CA", "the CA's common name")
	f.IntVar(&days, "days", int(cluster.DefaultCAValidity/(24*time.Hour)), "validity in days")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

func newClusterCertNodeCmd() *cobra.Command {
	var caDir, out, name string
	var addresses []string
	var days int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "node --ca DIR --name NODE --address HOST[,HOST...] --out DIR",
		Short: "Make a node's certificate, signed by the CA in --ca, for the hosts other nodes reach it at: DIR/node.crt, DIR/node.key (0600) and a copy of ca.crt",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if days < 1 {
				return fmt.Errorf("--days %d: at least 1", days)
			}
			ca, caPEM, err := readCA(caDir)
			if err != nil {
				return err
			}
			var hosts []string
			for _, a := range addresses {
				h, err := cluster.SANHost(a)
				if err != nil {
					return fmt.Errorf("--address: %w", err)
				}
				hosts = append(hosts, h)
			}
			iss, err := ca.IssueNode(name, hosts, time.Now(), time.Duration(days)*24*time.Hour)
			if err != nil {
				return err
			}
			files, err := writeCertFiles(out, []certFile{
				{nodeKeyFile, iss.KeyPEM, 0o600},
				{nodeCertFile, iss.CertPEM, 0o644},
				{caCertFile, caPEM, 0o644},
			})
			if err != nil {
				return err
			}
			info := certInfo{Name: name, Cert: files[1], Key: files[0], CA: files[2], Addresses: hosts,
				NotAfter: iss.Cert.NotAfter.UTC(), SHA256: cluster.Fingerprint(iss.Cert)}
			return printCertInfo(cmd.OutOrStdout(), asJSON, info, fmt.Sprintf(
				"On node %s: --cluster-tls-cert %s --cluster-tls-key %s --cluster-tls-ca %s; its --node-address must have one of these hosts.",
				name, info.Cert, info.Key, info.CA))
		},
	}
	f := cmd.Flags()
	f.StringVar(&caDir, "ca", "", "directory of the CA (ca.crt and ca.key, from cluster-cert ca)")
	f.StringVar(&name, "name", "", "the node's name (the certificate's common name; the node's hostname will do)")
	f.StringSliceVar(&addresses, "address", nil, "hosts the other nodes reach this node at: the host of its --node-address (an IP address or a DNS name; host:port is taken too); comma-separated or repeated")
	f.StringVar(&out, "out", "", "directory to write node.crt, node.key and ca.crt into (created 0700; existing files are not replaced)")
	f.IntVar(&days, "days", int(cluster.DefaultNodeValidity/(24*time.Hour)), "validity in days (never beyond the CA's)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	for _, req := range []string{"ca", "name", "address", "out"} {
		_ = cmd.MarkFlagRequired(req)
	}
	return cmd
}

// readCA reads the CA that `cluster-cert ca` wrote into dir.
func readCA(dir string) (*cluster.CA, []byte, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return nil, nil, fmt.Errorf("--ca: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, caKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("--ca: %w", err)
	}
	ca, err := cluster.ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("--ca %s: %w", dir, err)
	}
	return ca, certPEM, nil
}

type certFile struct {
	name string
	data []byte
	mode os.FileMode
}

// writeCertFiles writes files into dir (made 0700 if missing) and returns
// their absolute paths. It never replaces a file: a CA key overwritten by
// mistake would cut every node off. A file that already holds the same
// bytes (ca.crt written into the CA's own directory) is left as it is. On
// an error the files written so far are removed, so a second try does not
// stop on the remains of the first.
func writeCertFiles(dir string, files []certFile) ([]string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	var paths, written []string
	fail := func(err error) ([]string, error) {
		for _, p := range written {
			_ = os.Remove(p)
		}
		return nil, err
	}
	for _, cf := range files {
		path := filepath.Join(dir, cf.name)
		paths = append(paths, path)
		if old, err := os.ReadFile(path); err == nil {
			if bytes.Equal(old, cf.data) {
				continue
			}
			return fail(fmt.Errorf("%s exists: not replaced (remove it first, or choose another --out)", path))
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, cf.mode)
		if err != nil {
			return fail(fmt.Errorf("write %s: %w", path, err))
		}
		written = append(written, path)
		_, err = f.Write(cf.data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fail(fmt.Errorf("write %s: %w", path, err))
		}
	}
	return paths, nil
}

func printCertInfo(w io.Writer, asJSON bool, info certInfo, note string) error {
	if asJSON {
		return printJSON(w, info)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "NAME\t%s\nCERT\t%s\nKEY\t%s\n", info.Name, info.Cert, info.Key)
	if info.CA != "" {
		fmt.Fprintf(tw, "CA\t%s\n", info.CA)
	}
	if len(info.Addresses) > 0 {
		fmt.Fprintf(tw, "ADDRESSES\t%v\n", info.Addresses)
	}
	fmt.Fprintf(tw, "NOT AFTER\t%s\nSHA256\t%s\n", info.NotAfter.Format(time.RFC3339), info.SHA256)
	fmt.Fprintf(tw, "\n%s\n", note)
	return tw.Flush()
}
