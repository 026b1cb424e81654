package api

type ctxKey int

const (
	callerKey ctxKey = iota
	bodyKey
)
