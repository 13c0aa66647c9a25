package srunargs

import (
	"reflect"
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
