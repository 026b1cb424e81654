package api

import (
	"net/http"
	"net/url"

	"github.com/sandboxd/sandboxd/internal/contract"
)

// readBody decodes the body and validates it with parse.
func readBody[T any](w http.ResponseWriter, r *http.Request, parse func(contract.Args) (T, error)) (T, error) {
	o, err := contract.ReadArgs(w, r)
	if err != nil {
		var zero T
		return zero, err
	}
	return parse(o)
}

// bindBody is the start of every handler with a JSON body: decode,
// validate, resolve the account the request acts for. On failure it has
// answered and ok is false.
func bindBody[T contract.ActsFor](s *Server, w http.ResponseWriter, r *http.Request, parse func(contract.Args) (T, error)) (req T, account string, err error) {
	req, err = readBody(w, r, parse)
	if err == nil {
		account, err = s.actFor(r, req.ActingFor())
	}
	return req, account, err
}

// bindQuery is bindBody for handlers whose input is the query string.
func bindQuery[T contract.ActsFor](s *Server, w http.ResponseWriter, r *http.Request, parse func(url.Values) (T, error)) (q T, account string, err error) {
	q, err = parse(r.URL.Query())
	if err == nil {
		account, err = s.actFor(r, q.ActingFor())
	}
	return q, account, err
}
