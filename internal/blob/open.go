package blob

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Environment variables holding S3 credentials when the URL carries none.
const (
	EnvS3AccessKey = "SANDBOXD_S3_ACCESS_KEY"
	EnvS3SecretKey = "SANDBOXD_S3_SECRET_KEY"
)

// Open returns the store that rawURL describes (see the package doc for the
// format). dataDir is the node's data directory, home of the local store and
// of the S3 store's spool; it may be empty only when the URL names
// directories for both.
func Open(ctx context.Context, rawURL, dataDir string) (Store, error) {
	cfg, err := parseURL(rawURL, dataDir, os.Getenv)
	if err != nil {
		return nil, err
	}
	if cfg.s3 != nil {
		return NewS3(ctx, *cfg.s3)
	}
	return NewLocal(cfg.localDir)
}

// storeConfig is a parsed store URL: either a local directory or an S3
// configuration.
type storeConfig struct {
	localDir string
	s3       *S3Config
}

// parseURL parses a store URL, taking S3 credentials missing from it from
// getenv.
func parseURL(rawURL, dataDir string, getenv func(string) string) (storeConfig, error) {
	if rawURL == "" {
		if dataDir == "" {
			return storeConfig{}, errors.New("open blob store: no URL and no data directory")
		}
		return storeConfig{localDir: filepath.Join(dataDir, "blobs")}, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error repeats the URL, which may hold a secret.
		return storeConfig{}, fmt.Errorf("open blob store: malformed URL: %w", errors.Unwrap(err))
	}
	// What identifies the store in errors, without credentials.
	where := u.Redacted()
	switch u.Scheme {
	case "file":
		return parseFileURL(u, where, dataDir)
	case "s3":
		return parseS3URL(u, where, dataDir, getenv)
	default:
		return storeConfig{}, fmt.Errorf("open blob store %s: unknown scheme %q (want file or s3)", where, u.Scheme)
	}
}

func parseFileURL(u *url.URL, where, dataDir string) (storeConfig, error) {
	if u.Host != "" && u.Host != "localhost" {
		return storeConfig{}, fmt.Errorf("open blob store %s: file URLs name a local path (file:///dir), not host %q", where, u.Host)
	}
	if u.User != nil || u.RawQuery != "" || u.Opaque != "" {
		return storeConfig{}, fmt.Errorf("open blob store %s: file URLs take only a path", where)
	}
	if u.Path == "" {
		if dataDir == "" {
			return storeConfig{}, fmt.Errorf("open blob store %s: no path and no data directory", where)
		}
		return storeConfig{localDir: filepath.Join(dataDir, "blobs")}, nil
	}
	dir := filepath.Clean(u.Path)
	if dir == "/" {
		return storeConfig{}, fmt.Errorf("open blob store %s: refusing the root directory", where)
	}
	return storeConfig{localDir: dir}, nil
}

func parseS3URL(u *url.URL, where, dataDir string, getenv func(string) string) (storeConfig, error) {
	if u.Host == "" {
		return storeConfig{}, fmt.Errorf("open blob store %s: no endpoint host", where)
	}
	bucket, prefix, _ := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	if bucket == "" {
		return storeConfig{}, fmt.Errorf("open blob store %s: no bucket (s3://host/bucket[/prefix])", where)
	}
	cfg := &S3Config{Endpoint: u.Host, Bucket: bucket, Prefix: prefix}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}

	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return storeConfig{}, fmt.Errorf("open blob store %s: query: %w", where, err)
	}
	for name, vals := range q {
		if len(vals) != 1 {
			return storeConfig{}, fmt.Errorf("open blob store %s: %s given %d times", where, name, len(vals))
		}
		v := vals[0]
		switch name {
		case "region":
			cfg.Region = v
		case "tls":
			on, err := strconv.ParseBool(v)
			if err != nil {
				return storeConfig{}, fmt.Errorf("open blob store %s: tls=%q is not a boolean", where, v)
			}
			cfg.Insecure = !on
		case "spool":
			if !filepath.IsAbs(v) {
				return storeConfig{}, fmt.Errorf("open blob store %s: spool=%q is not an absolute path", where, v)
			}
			cfg.SpoolDir = filepath.Clean(v)
		default:
			// Refusing unknown parameters turns a typo into an error
			// instead of a silently different store.
			return storeConfig{}, fmt.Errorf("open blob store %s: unknown parameter %q (want region, tls or spool)", where, name)
		}
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	if cfg.SpoolDir == "" && dataDir != "" {
		cfg.SpoolDir = filepath.Join(dataDir, "blobs-spool")
	}

	if u.User != nil {
		cfg.AccessKey = u.User.Username()
		cfg.SecretKey, _ = u.User.Password()
	} else {
		cfg.AccessKey = getenv(EnvS3AccessKey)
		cfg.SecretKey = getenv(EnvS3SecretKey)
	}
	if cfg.AccessKey == "" || cfg.SecretKey == "" {
		return storeConfig{}, fmt.Errorf("open blob store %s: no credentials: put ACCESS:SECRET in the URL or set %s and %s", where, EnvS3AccessKey, EnvS3SecretKey)
	}
	return storeConfig{s3: cfg}, nil
}
