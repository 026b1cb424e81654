package templatespec

import (
	"strings"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// DefaultTag is the tag of a name given without one.
const DefaultTag = "latest"

// Name limits: a name fits a DNS label (so it can name things elsewhere,
// e.g. a host or a directory, without escaping) and a tag is Docker's.
const (
	maxNameLen = 63
	maxTagLen  = 128
)

// Ref is a template's name and tag, "name[:tag]".
//
// A name is 1 to 63 characters of lower-case letters, digits, '-', '_' and
// '.', starting and ending with a letter or a digit. Upper case is refused,
// not folded, so that one template never has two spellings. A tag is 1 to
// 128 characters of letters, digits, '_', '.' and '-', not starting with
// '.' or '-' (Docker's tag rule). A name without a tag has DefaultTag.
type Ref struct {
	Name string
	Tag  string
}

// String is "name:tag".
func (r Ref) String() string { return r.Name + ":" + r.Tag }

// ParseRef reads "name[:tag]".
func ParseRef(s string) (Ref, error) {
	name, tag, hasTag := strings.Cut(s, ":")
	if hasTag && tag == "" {
		return Ref{}, errdefs.Newf(errdefs.ErrInvalid, "template name %q: the tag after ':' is empty", s)
	}
	if !hasTag {
		tag = DefaultTag
	}
	if err := ValidateName(name); err != nil {
		return Ref{}, err
	}
	if err := ValidateTag(tag); err != nil {
		return Ref{}, err
	}
	return Ref{Name: name, Tag: tag}, nil
}

// ValidateName says whether s is a valid template name (see Ref).
func ValidateName(s string) error {
	switch {
	case s == "":
		return errdefs.New(errdefs.ErrInvalid, "template name is empty")
	case len(s) > maxNameLen:
		return errdefs.Newf(errdefs.ErrInvalid, "template name %q is longer than %d characters", clip(s), maxNameLen)
	case !isLowerAlnum(s[0]) || !isLowerAlnum(s[len(s)-1]):
		return errdefs.Newf(errdefs.ErrInvalid, "template name %q must start and end with a lower-case letter or a digit", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isLowerAlnum(c) && c != '-' && c != '_' && c != '.' {
			return errdefs.Newf(errdefs.ErrInvalid, "template name %q: %q is not allowed (lower-case letters, digits, '-', '_' and '.')", s, string(rune(c)))
		}
	}
	return nil
}

// ValidateTag says whether s is a valid tag (see Ref).
func ValidateTag(s string) error {
	switch {
	case s == "":
		return errdefs.New(errdefs.ErrInvalid, "template tag is empty")
	case len(s) > maxTagLen:
		return errdefs.Newf(errdefs.ErrInvalid, "template tag %q is longer than %d characters", clip(s), maxTagLen)
	case s[0] == '.' || s[0] == '-':
		return errdefs.Newf(errdefs.ErrInvalid, "template tag %q must not start with '.' or '-'", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isLowerAlnum(c) && !('A' <= c && c <= 'Z') && c != '-' && c != '_' && c != '.' {
			return errdefs.Newf(errdefs.ErrInvalid, "template tag %q: %q is not allowed (letters, digits, '-', '_' and '.')", s, string(rune(c)))
		}
	}
	return nil
}

func isLowerAlnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }

// clip shortens s for an error message, so that a hostile input is not
// echoed back whole.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
