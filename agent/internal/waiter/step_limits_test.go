package waiter

import (
	"slices"
	"testing"
)

// The job's start: what slurmstepd set for the waiter (startlimits' order).
var jobStart = []string{"SLURM_RLIMIT_CPU=18446744073709551615", "SLURM_RLIMIT_STACK=8388608",
	"SLURM_RLIMIT_CORE=0", "SLURM_RLIMIT_NOFILE=1024", "SLURM_RLIMIT_NICE=0", "SLURM_UMASK=0022"}

func withJobStart(t *testing.T) {
	saved := startLimits
	startLimits = jobStart
	t.Cleanup(func() { startLimits = saved })
}

// What the pod's srun sent after the script ran `ulimit -s unlimited -c 1000; umask 027`.
var fromThePod = Object{{"PATH", "/usr/bin"}, {"SLURM_RLIMIT_STACK", "18446744073709551615"},
	{"SLURM_RLIMIT_CORE", "1024000"}, {"SLURM_RLIMIT_NICE", "40"}, {"SLURM_UMASK", "0027"}}

func TestTheScriptsLimitsReachItsStepsWhereSrunWouldPropagateThem(t *testing.T) {
	withJobStart(t)
	env, options := stepLimits(fromThePod, []string{"--ntasks=2"})
	want := []string{"SLURM_UMASK=0027", "SLURM_RLIMIT_CPU=18446744073709551615",
		"SLURM_RLIMIT_STACK=18446744073709551615", "SLURM_RLIMIT_CORE=1024000", "SLURM_RLIMIT_NOFILE=1024"}
	if !slices.Equal(env, want) {
		t.Errorf("env %q, want %q (what the pod sent, the job's start for the rest; NICE is not Slurm's)", env, want)
	}
	if !slices.Equal(options, []string{"--propagate=NONE"}) {
		t.Errorf("options %q: Slurm's srun must not put its own limits over these", options)
	}
}

func TestTheUsersPropagateChoosesAndMarksTheLimits(t *testing.T) {
	withJobStart(t)
	for _, c := range []struct {
		options []string
		want    []string
	}{
		{[]string{"--propagate=STACK,RLIMIT_NOFILE"},
			[]string{"SLURM_UMASK=0027", "SLURM_RLIMIT_STACK=U18446744073709551615", "SLURM_RLIMIT_NOFILE=U1024"}},
		{[]string{"--propagate"}, []string{"SLURM_UMASK=0027", "SLURM_RLIMIT_CPU=U18446744073709551615",
			"SLURM_RLIMIT_STACK=U18446744073709551615", "SLURM_RLIMIT_CORE=U1024000", "SLURM_RLIMIT_NOFILE=U1024"}},
		{[]string{"--propagate=STACK", "--propagate=NONE"}, []string{"SLURM_UMASK=0027"}},
	} {
		env, options := stepLimits(fromThePod, c.options)
		if !slices.Equal(env, c.want) || !slices.Equal(options, []string{"--propagate=NONE"}) {
			t.Errorf("%q: env %q options %q, want %q", c.options, env, options, c.want)
		}
	}
	// A name Slurm does not know: its srun refuses the option itself.
	env, options := stepLimits(fromThePod, []string{"--propagate=STACK,BOGUS"})
	if options != nil || !slices.Equal(env, []string{"SLURM_UMASK=0027"}) {
		t.Errorf("env %q options %q: want the user's option to reach Slurm's srun alone", env, options)
	}
}

func TestAnythingButALimitOrAUmaskAsSrunWritesThemIsIgnored(t *testing.T) {
	withJobStart(t)
	planted := Object{{"SLURM_RLIMIT_STACK", "1; rm -rf /"}, {"SLURM_RLIMIT_CORE", "-1"},
		{"SLURM_RLIMIT_NOFILE", "123456789012345678901"}, {"SLURM_RLIMIT_LD_PRELOAD", "1"},
		{"SLURM_UMASK", "0o777"}, {"SLURM_RLIMIT_CPU", ""}}
	if env, options := stepLimits(planted, nil); env != nil || options != nil {
		t.Errorf("env %q options %q: want nothing from these", env, options)
	}
	// An older agent's srun sends none: Slurm's srun propagates the waiter's own, as before.
	if env, options := stepLimits(Object{{"PATH", "/bin"}}, nil); env != nil || options != nil {
		t.Errorf("env %q options %q: want nothing", env, options)
	}
}
