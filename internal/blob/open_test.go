package blob

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	env := map[string]string{EnvS3AccessKey: "envkey", EnvS3SecretKey: "envsecret"}
	getenv := func(k string) string { return env[k] }
	noenv := func(string) string { return "" }

	tests := []struct {
		name    string
		url     string
		dataDir string
		getenv  func(string) string
		want    storeConfig
		wantErr string // substring; "" means success
	}{
		{name: "empty", url: "", dataDir: "/var/lib/sandboxd", want: storeConfig{localDir: "/var/lib/sandboxd/blobs"}},
		{name: "empty without data dir", url: "", wantErr: "no URL and no data directory"},
		{name: "file without path", url: "file://", dataDir: "/d", want: storeConfig{localDir: "/d/blobs"}},
		{name: "file with path", url: "file:///srv/blobs/", dataDir: "/d", want: storeConfig{localDir: "/srv/blobs"}},
		{name: "file localhost", url: "file://localhost/srv/b", want: storeConfig{localDir: "/srv/b"}},
		{name: "file path cleaned", url: "file:///srv/x/../blobs", want: storeConfig{localDir: "/srv/blobs"}},
		{name: "file root refused", url: "file:///", wantErr: "root directory"},
		{name: "file remote host", url: "file://nas/blobs", wantErr: "not host"},
		{name: "file relative", url: "file:blobs", wantErr: "only a path"},
		{name: "file query", url: "file:///b?x=1", wantErr: "only a path"},
		{name: "file without path or data dir", url: "file://", wantErr: "no data directory"},
		{
			name: "s3 full", url: "s3://AK:SK@127.0.0.1:9000/bucket/some/prefix?region=eu-west-3&tls=false", dataDir: "/d",
			want: storeConfig{s3: &S3Config{
				Endpoint: "127.0.0.1:9000", Bucket: "bucket", Prefix: "some/prefix/",
				AccessKey: "AK", SecretKey: "SK", Region: "eu-west-3", Insecure: true, SpoolDir: "/d/blobs-spool",
			}},
		},
		{
			name: "s3 defaults", url: "s3://AK:SK@s3.example.com/bucket", dataDir: "/d",
			want: storeConfig{s3: &S3Config{
				Endpoint: "s3.example.com", Bucket: "bucket",
				AccessKey: "AK", SecretKey: "SK", Region: "us-east-1", SpoolDir: "/d/blobs-spool",
			}},
		},
		{
			name: "s3 trailing slash, tls on, spool", url: "s3://AK:SK@h:1/b/p/?tls=true&spool=/fast/spool",
			want: storeConfig{s3: &S3Config{
				Endpoint: "h:1", Bucket: "b", Prefix: "p/",
				AccessKey: "AK", SecretKey: "SK", Region: "us-east-1", SpoolDir: "/fast/spool",
			}},
		},
		{
			name: "s3 escaped secret", url: "s3://AK:s%2Fe%3Acret%40x@h/b",
			want: storeConfig{s3: &S3Config{
				Endpoint: "h", Bucket: "b", AccessKey: "AK", SecretKey: "s/e:cret@x", Region: "us-east-1",
			}},
		},
		{
			name: "s3 credentials from env", url: "s3://h:9000/b", getenv: getenv,
			want: storeConfig{s3: &S3Config{
				Endpoint: "h:9000", Bucket: "b", AccessKey: "envkey", SecretKey: "envsecret", Region: "us-east-1",
			}},
		},
		{
			name: "s3 URL credentials win over env", url: "s3://AK:SK@h/b", getenv: getenv,
			want: storeConfig{s3: &S3Config{
				Endpoint: "h", Bucket: "b", AccessKey: "AK", SecretKey: "SK", Region: "us-east-1",
			}},
		},
		{name: "s3 no credentials", url: "s3://h/b", getenv: noenv, wantErr: "no credentials"},
		{name: "s3 no secret", url: "s3://AK@h/b", getenv: getenv, wantErr: "no credentials"},
		{name: "s3 no bucket", url: "s3://AK:SK@h", wantErr: "no bucket"},
		{name: "s3 no bucket, slash", url: "s3://AK:SK@h/", wantErr: "no bucket"},
		{name: "s3 no host", url: "s3:///b", wantErr: "no endpoint"},
		{name: "s3 bad tls", url: "s3://AK:SK@h/b?tls=maybe", wantErr: "not a boolean"},
		{name: "s3 relative spool", url: "s3://AK:SK@h/b?spool=tmp", wantErr: "absolute"},
		{name: "s3 unknown parameter", url: "s3://AK:SK@h/b?regoin=x", wantErr: `unknown parameter "regoin"`},
		{name: "s3 repeated parameter", url: "s3://AK:SK@h/b?region=a&region=b", wantErr: "2 times"},
		{name: "unknown scheme", url: "gs://b", wantErr: "unknown scheme"},
		{name: "malformed", url: "s3://AK:SK@h:port:x/b", wantErr: "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ge := tt.getenv
			if ge == nil {
				ge = noenv
			}
			got, err := parseURL(tt.url, tt.dataDir, ge)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseURL(%q) error = %v, want one containing %q", tt.url, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseURL(%q): %v", tt.url, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("parseURL(%q) =\n%+v %+v\nwant\n%+v %+v", tt.url, got, got.s3, tt.want, tt.want.s3)
			}
		})
	}
}

// Errors about a URL name the store without its secret.
func TestParseURLErrorsHideSecret(t *testing.T) {
	for _, u := range []string{
		"s3://AK:topsecret@h/b?tls=maybe",
		"s3://AK:topsecret@h:port:x/b",
		"s3://AK:topsecret@h/b?bogus=1",
		"s3://AK:topsecret@h",
	} {
		_, err := parseURL(u, "/d", func(string) string { return "" })
		if err == nil {
			t.Fatalf("parseURL(%q) succeeded", u)
		}
		if strings.Contains(err.Error(), "topsecret") {
			t.Errorf("parseURL(%q) error reveals the secret: %v", u, err)
		}
	}
}
