package templatespec

// Limits bound what a definition may hold, so that a hostile Dockerfile or
// body costs a bounded amount of memory and time to read, and a bounded
// amount to store. A zero field takes its value from DefaultLimits.
type Limits struct {
	DockerfileBytes int // a whole Dockerfile
	JSONBytes       int // a whole steps JSON body
	LineBytes       int // one physical line of a Dockerfile
	Steps           int // steps in one template
	CommandBytes    int // one RUN command, the start or the ready command
	EnvVars         int // names set by ENV and ARG, all steps together
	EnvValueBytes   int // one ENV or ARG value (after substitution)
	EnvBytes        int // all ENV and ARG names and values together
	FieldBytes      int // any other string: an image reference, a path, a user
}

// DefaultLimits are generous for real templates and small next to a node.
func DefaultLimits() Limits {
	return Limits{
		DockerfileBytes: 256 << 10,
		JSONBytes:       1 << 20,
		LineBytes:       64 << 10,
		Steps:           256,
		CommandBytes:    64 << 10,
		EnvVars:         512,
		EnvValueBytes:   32 << 10,
		EnvBytes:        256 << 10,
		FieldBytes:      4 << 10,
	}
}

// orDefaults fills the zero fields of l from DefaultLimits.
func (l Limits) orDefaults() Limits {
	d := DefaultLimits()
	pick := func(v, def int) int {
		if v <= 0 {
			return def
		}
		return v
	}
	return Limits{
		DockerfileBytes: pick(l.DockerfileBytes, d.DockerfileBytes),
		JSONBytes:       pick(l.JSONBytes, d.JSONBytes),
		LineBytes:       pick(l.LineBytes, d.LineBytes),
		Steps:           pick(l.Steps, d.Steps),
		CommandBytes:    pick(l.CommandBytes, d.CommandBytes),
		EnvVars:         pick(l.EnvVars, d.EnvVars),
		EnvValueBytes:   pick(l.EnvValueBytes, d.EnvValueBytes),
		EnvBytes:        pick(l.EnvBytes, d.EnvBytes),
		FieldBytes:      pick(l.FieldBytes, d.FieldBytes),
	}
}
