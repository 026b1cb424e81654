package oci

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// fail turns err into what Resolve and Fetch return: an errdefs class and
// a message for the user, with the credentials scrubbed from its text.
func (p *pull) fail(err error) error {
	if err == nil {
		return nil
	}
	return scrub(p.classify(err), p.opts.Credentials.secrets())
}

func (p *pull) classify(err error) error {
	var (
		de *errdefs.Error
		ae *fetch.AddressError
		te *transport.Error
	)
	switch {
	case errors.As(err, &de):
		return err // explained where it happened
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("oci: pull %s: %w", p.ref, err)
	case errors.As(err, &ae):
		return errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("the registry of %s is at %s, a %s address, which this server does not connect to", p.ref, ae.IP, ae.Class))
	case errors.Is(err, fetch.ErrHostNotFound):
		return errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("the registry of %s was not found", p.ref))
	case errors.Is(err, snapshot.ErrTooManyEntries):
		return errdefs.Wrap(errdefs.ErrTooLarge, err, fmt.Sprintf("image %s has more than the limit of %d files, directories and links", p.ref, p.lim.MaxEntries))
	case errors.Is(err, snapshot.ErrFormat):
		return errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("image %s has a layer that cannot be unpacked safely (%s)", p.ref, lastPart(err)))
	case errors.As(err, &te):
		switch {
		case te.StatusCode == 401 || te.StatusCode == 403 || hasCode(te, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			if p.opts.Credentials == (Credentials{}) {
				return errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("the registry refused access to %s (HTTP %d): it needs credentials", p.ref, te.StatusCode))
			}
			return errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("the registry refused the credentials for %s (HTTP %d): they are wrong or may not read this image", p.ref, te.StatusCode))
		case te.StatusCode == 404 || hasCode(te, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode):
			return errdefs.Wrap(errdefs.ErrNotFound, err, fmt.Sprintf("image %s was not found in its registry", p.ref))
		}
		return errdefs.Wrap(nil, err, fmt.Sprintf("the registry of %s answered HTTP %d", p.ref, te.StatusCode))
	}
	return errdefs.Wrap(nil, err, fmt.Sprintf("pulling image %s failed", p.ref))
}

func hasCode(te *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range te.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

// lastPart is the innermost part of err's text, which for snapshot's
// format errors says what is wrong with which entry ("unsafe entry name
// \"../x\"") without the layers of context above it.
func lastPart(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

// kept are the sentinels a scrubbed error still answers errors.Is for.
var kept = []error{
	errdefs.ErrInvalid, errdefs.ErrNotFound, errdefs.ErrTooLarge,
	context.Canceled, context.DeadlineExceeded,
	fetch.ErrAddressNotAllowed, snapshot.ErrFormat, snapshot.ErrTooManyEntries,
}

// scrubbed is an error whose text had secrets in it, rewritten without
// them. It drops the original chain, where the secrets still are, keeping
// only the sentinels in kept.
type scrubbed struct {
	text  string
	kinds []error
}

func (e *scrubbed) Error() string   { return e.text }
func (e *scrubbed) Unwrap() []error { return e.kinds }

// scrub returns err, or when its text shows one of secrets (a registry
// may echo what it was sent), the same error with them replaced.
func scrub(err error, secrets []string) error {
	text := err.Error()
	var pairs []string
	for _, s := range secrets {
		if strings.Contains(text, s) {
			pairs = append(pairs, s, "[redacted]")
		}
	}
	if len(pairs) == 0 {
		return err
	}
	rep := strings.NewReplacer(pairs...)
	var kinds []error
	for _, k := range kept {
		if errors.Is(err, k) {
			kinds = append(kinds, k)
		}
	}
	var de *errdefs.Error
	if errors.As(err, &de) && de.Err != nil && err == error(de) {
		return errdefs.Wrap(de.Class, &scrubbed{text: rep.Replace(de.Err.Error()), kinds: kinds}, rep.Replace(de.Msg))
	}
	return &scrubbed{text: rep.Replace(text), kinds: kinds}
}
