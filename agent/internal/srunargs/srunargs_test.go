package srunargs

import (
	"reflect"
	"strings"
	"syscall"
	"testing"
)

func TestAPtyWithoutATerminalIsDisregardedAsNatively(t *testing.T) {
	noTerminal := func(int) error { return syscall.ENOTTY }
	const notATTY = "srun: error: ioctl(TIOCGWINSZ): Inappropriate ioctl for device\n"
	cases := []struct {
		argv, want []string
		said       string
	}{
		{[]string{"--pty", "bash", "-c", "true"}, []string{"bash", "-c", "true"},
			notATTY + "srun: error: Not using a pseudo-terminal, disregarding --pty option\n"},
		{[]string{"-n", "2", "--pt", "-l", "--cpu-bind", "none", "echo", "--pty"},
			[]string{"-n", "2", "-l", "--cpu-bind", "none", "echo", "--pty"},
			notATTY + "srun: error: Not using a pseudo-terminal, disregarding --pty option\n"},
		{[]string{"--pty=5", "-N1", "hostname"}, []string{"-N1", "hostname"},
			notATTY + "srun: error: Not using a pseudo-terminal, disregarding --pty=5 option\n"},
		{[]string{"-l", "--", "--pty", "x"}, []string{"-l", "--", "--pty", "x"}, ""}, // the command's
		{[]string{"--pty=x", "true"}, []string{"--pty=x", "true"}, ""},               // srun refuses it
	}
	for _, c := range cases {
		got, said := WithoutPty(c.argv, noTerminal)
		if !reflect.DeepEqual(got, c.want) || said != c.said {
			t.Errorf("WithoutPty(%q) = %q, %q; want %q, %q", c.argv, got, said, c.want, c.said)
		}
	}
	onTerminal := func(fd int) error {
		if fd == 0 {
			return nil
		}
		return syscall.ENOTTY
	}
	if got, said := WithoutPty([]string{"--pty", "bash"}, onTerminal); said != "" || len(got) != 2 {
		t.Errorf("a --pty on a terminal stays: %q, %q", got, said)
	}
}

func TestTheOwnJobsJobIDIsDroppedAnothersStays(t *testing.T) {
	cases := []struct{ argv, want []string }{
		{[]string{"--jobid=42", "-l", "hostname"}, []string{"-l", "hostname"}},
		{[]string{"-n", "1", "--jobid", "42", "true"}, []string{"-n", "1", "true"}},
		{[]string{"--jobid=42", "--jobid=7", "true"}, []string{"--jobid=42", "--jobid=7", "true"}},
		{[]string{"--jobid=7", "true"}, []string{"--jobid=7", "true"}},
		{[]string{"true", "--jobid=42"}, []string{"true", "--jobid=42"}},
	}
	for _, c := range cases {
		if got := WithoutOwnJobID(c.argv, "42"); !reflect.DeepEqual(got, c.want) {
			t.Errorf("WithoutOwnJobID(%q) = %q; want %q", c.argv, got, c.want)
		}
	}
	if got := WithoutOwnJobID([]string{"--jobid=", "true"}, ""); len(got) != 2 {
		t.Errorf("no job id known: %q", got)
	}
}

func TestHelpUsageAndVersionAreFoundAsSrunReadsItsOptions(t *testing.T) {
	cases := []struct {
		argv []string
		want string
	}{
		{[]string{"--version"}, "--version"}, {[]string{"-V"}, "--version"}, {[]string{"-h"}, "--help"},
		{[]string{"--vers", "true"}, "--version"}, {[]string{"--usage"}, "--usage"},
		{[]string{"-n", "1", "--version"}, "--version"}, {[]string{"-lV"}, "--version"},
		{[]string{"--bcast", "--help"}, "--help"}, // refused for a step, but srun prints its help first
		{[]string{"-J", "-V", "true"}, ""},        // -V is the job's name
		{[]string{"-JV", "true"}, ""},
		{[]string{"true", "--version"}, ""},  // the command's
		{[]string{"--xyz", "--version"}, ""}, // getopt stops at --xyz first
		{[]string{"--version=1"}, ""},        // getopt's "doesn't allow an argument"
		{[]string{"--", "--version"}, ""},
		{[]string{"--mpi=list"}, "--mpi=list"}, {[]string{"-n1", "--mpi", "list"}, "--mpi=list"},
		{[]string{"--mpi=pmi2", "true"}, ""},
		{[]string{"--mpi=list", "--mpi=none", "true"}, ""}, // the last --mpi wins: the step runs
		{[]string{"--mpi=list", "--help"}, "--help"},       // help is acted on as it is read
		{[]string{"--mpi=list", "--xyz"}, ""},              // getopt's error first
		{[]string{"--mpi=list", "-N"}, ""},
	}
	for _, c := range cases {
		if got := Info(c.argv); got != c.want {
			t.Errorf("Info(%q) = %q; want %q", c.argv, got, c.want)
		}
	}
}

func TestACommandLineSrunCannotReadGetsGetoptsWords(t *testing.T) {
	const try = "\nTry \"srun --help\" for more information"
	cases := map[string][]string{
		"srun: unrecognized option '--xyz=3'" + try:                   {"--xyz=3", "x"},
		"srun: invalid option -- 'y'" + try:                           {"-y", "x"},
		"srun: option requires an argument -- 'N'" + try:              {"-N"},
		"srun: option '--ntasks-per-node' requires an argument" + try: {"--ntasks-per-n"},
		"srun: option '--label' doesn't allow an argument" + try:      {"--label=x", "x"},
		"srun: option '--cpu' is ambiguous; possibilities: '--cpu-bind' '--cpu-freq' '--cpus-per-gpu' " +
			"'--cpus-per-task'" + try: {"--cpu", "x"},
		// glibc leaves out only the first match's own aliases.
		"srun: option '--pa' is ambiguous; possibilities: '--pack-group' '--parsable' '--partition'" + try: {"--pa", "x"},
	}
	for want, argv := range cases {
		if _, _, err := Split(argv); err == nil || err.Error() != want {
			t.Errorf("Split(%q) = %v; want %q", argv, err, want)
		}
	}
	if passed, _, err := Split([]string{"--extra=a", "x"}); err != nil || !reflect.DeepEqual(passed, []string{"--extra=a"}) {
		t.Errorf("--extra is its own option, not --extra-node-info: %q, %v", passed, err)
	}
}

func TestANodeListThatNamesAFileIsRefused(t *testing.T) {
	// Slurm's srun would read it on the slurmd host, where the waiter runs it.
	for _, argv := range [][]string{{"-w", "/etc/hosts", "x"}, {"--exclude=./nodes", "x"}, {"-x./n", "x"}} {
		if _, _, err := Split(argv); err == nil || !strings.Contains(err.Error(), "names a file") {
			t.Errorf("Split(%q) = %v", argv, err)
		}
	}
	if passed, _, err := Split([]string{"--resv-ports=2", "--overlap=force", "-w", "kreal[1-2]", "x"}); err != nil ||
		!reflect.DeepEqual(passed, []string{"--resv-ports=2", "--overlap=force", "--nodelist=kreal[1-2]"}) {
		t.Errorf("optional values and a node list: %q, %v", passed, err)
	}
}
