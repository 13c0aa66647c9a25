package waiter

import (
	"strings"
	"syscall"
)

// The job's environment as the waiter takes it, and the fixed one its own helpers get.

const (
	// HeldPrefix is where the SPANK step guard moves every variable but SLURM_*.
	HeldPrefix = "SLURM_K8S_BRIDGE_HELD_"
	// HeldMarker is set by the guard once it has held the environment.
	HeldMarker = "SLURM_K8S_BRIDGE_ENV_HELD"
)

// SafeEnvironment is what the waiter's own helpers (munge, Slurm's srun) run with.
func SafeEnvironment() []string {
	return []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
}

// startEnviron is the environment the waiter was started with, as Main was given it: the
// process's own lacks what the Go runtime must not read (internal/earlysignals). Nil: the
// process's own (the Go tests).
var startEnviron []string

// startLimits are SLURM_RLIMIT_<NAME>=<soft> entries of the limits the waiter started with and
// its SLURM_UMASK (internal/startlimits), as Main was given them.
var startLimits []string

// WithLimits is env with the waiter's start limits and umask: the pods' agent gives the job's
// processes the same, as slurmstepd gives a native job's. What the process had wins over a
// variable of the same name (slurmstepd ignores or removes those; it set what the process has).
func WithLimits(env Object) Object {
	out := append(Object{}, env...)
	for _, entry := range startLimits {
		if name, value, ok := strings.Cut(entry, "="); ok {
			out.Set(name, value)
		}
	}
	return out
}

// Environ is the environment the waiter was started with, in its order, as Python's os.environ
// holds it: entries without '=' left out, the first of a name kept.
func Environ() Object {
	entries := startEnviron
	if entries == nil {
		entries = syscall.Environ()
	}
	var env Object
	seen := map[string]bool{}
	for _, entry := range entries {
		name, value, ok := strings.Cut(entry, "=")
		if !ok || seen[name] {
			continue
		}
		seen[name] = true
		env = append(env, Field{name, value})
	}
	return env
}

// JobEnvironment is the job's environment as the user exported it: held variables get their
// names back. Where the guard held the environment, any variable but SLURM_* is the waiter's
// own, not the user's, and stays out.
func JobEnvironment(environ Object) Object {
	guarded := false
	if v, ok := environ.Get(HeldMarker); ok && v == "1" {
		guarded = true
	}
	var env, held Object
	for _, f := range environ {
		switch {
		case strings.HasPrefix(f.Key, HeldPrefix):
			held.Set(f.Key[len(HeldPrefix):], f.Value)
		case f.Key == HeldMarker:
		case !guarded || strings.HasPrefix(f.Key, "SLURM_"):
			env = append(env, f)
		}
	}
	for _, f := range held {
		if f.Key != "" {
			env.Set(f.Key, f.Value)
		}
	}
	return env
}

// lookup is the text value of name in env, or "".
func lookup(env Object, name string) string {
	if v, ok := env.Get(name); ok {
		if s, ok := v.(string); ok {
			return s
		}
	}
	return ""
}
