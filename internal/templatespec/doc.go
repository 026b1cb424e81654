// Package templatespec is a template's build definition as sandboxd's own
// data: the base it starts from, the steps that change it, and the command
// a sandbox from it starts with. It reads the definition from a Dockerfile
// (ParseDockerfile) or from the steps JSON that E2B's SDK sends and
// sandboxd's API takes (FromJSON), validates it against Limits, and names
// every step's result by a cache key (CacheKeys). It runs nothing: the build
// runner takes a Template and does the steps inside a build sandbox.
//
// Invariants:
//   - A Template that ParseDockerfile or FromJSON returns has passed Validate:
//     every field is within its Limits and every step has what its kind needs.
//   - Step kinds are E2B's step types one to one (RUN, COPY, ENV, WORKDIR,
//     USER, and ARG, which E2B's server takes as ENV), so the E2B wire maps
//     onto a Template without loss (docs/design/e2b-template-wire.md).
//   - Every error for the caller is of class errdefs.ErrInvalid (or
//     errdefs.ErrTooLarge for input over a size limit) and names where the
//     problem is: a Dockerfile line and instruction, or a JSON field path.
//   - A Template's registry credentials never leave it by JSON, fmt or slog
//     (RegistryAuth hides them), so a definition can be stored and logged.
package templatespec
