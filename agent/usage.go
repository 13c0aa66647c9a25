package main

// What the batch script's processes use, measured in the pod as Slurm's jobacct_gather/linux
// measures a task on a host: the process tree's CPU time (with what its processes reaped), RSS,
// virtual size, major faults and read/written characters from /proc while it runs, and the script's wait4 rusage (its reaped
// descendants included) when it ends. Each sample is a "u" frame; the daemon passes it to the
// job's waiter, and jobacct_gather/linux_k8s_bridge puts it in Slurm's accounting in the waiter's place
// (deploy/slurm/jobacct).

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// usageSampleEvery: the tree is sampled this often, so that a short peak of its memory is seen.
const usageSampleEvery = time.Second

// defaultUsageInterval bounds how often a sample is sent when nothing grew much (each is a log
// line the daemon relays): Slurm's own JobAcctGatherFrequency default (task=30).
const defaultUsageInterval = 30 * time.Second

// usageGrowth: a resident set this much above the last one sent is sent at once.
const usageGrowth = 1.1

const clockTicksPerSecond = 100 // USER_HZ on Linux

type usage struct {
	ioUnknown       bool // a process's /proc/PID/io could not be read: read and write are "-"
	userUs, sysUs   int64
	rss, maxRss     int64
	vsize, maxVsize int64
	read, write     int64
	majorFaults     int64
}

// line is the frame's text: the figures in the order the waiter and the plugin read them.
func (u *usage) line() []byte {
	fields := []int64{u.userUs, u.sysUs, u.rss, u.maxRss, u.vsize, u.maxVsize, u.read, u.write, u.majorFaults}
	parts := make([]string, len(fields))
	for i, value := range fields {
		parts[i] = strconv.FormatInt(value, 10)
	}
	if u.ioUnknown { // never a made-up figure: Slurm keeps its own for these
		parts[6], parts[7] = "-", "-"
	}
	return []byte(strings.Join(parts, " "))
}

type procSample struct {
	ppid                      int
	utime, stime, majorFaults int64
	vsize, rssPages           int64
}

// readProcStat reads /proc/PID/stat; the command name may hold spaces and parentheses, so the
// fields are counted from the last ')'.
func readProcStat(pid int) (procSample, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procSample{}, false
	}
	end := bytes.LastIndexByte(raw, ')')
	if end < 0 {
		return procSample{}, false
	}
	fields := strings.Fields(string(raw[end+1:]))
	// fields[0] is the state (field 3 of stat(5)); field N is fields[N-3].
	if len(fields) < 22 {
		return procSample{}, false
	}
	number := func(field int) int64 {
		value, _ := strconv.ParseInt(fields[field-3], 10, 64)
		return value
	}
	// With what each process reaped (cutime, cstime, cmajflt): a child that ended still counts,
	// so the figures never go down while the script runs.
	return procSample{
		ppid: int(number(4)), majorFaults: number(12) + number(13), utime: number(14) + number(16),
		stime: number(15) + number(17), vsize: number(23), rssPages: number(24),
	}, true
}

// readProcIO gives rchar and wchar of /proc/PID/io; false where it cannot be read.
func readProcIO(pid int) (int64, int64, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return 0, 0, false
	}
	var read, write int64
	for _, line := range strings.Split(string(raw), "\n") {
		name, value, found := strings.Cut(line, ": ")
		if !found {
			continue
		}
		number, _ := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		switch name {
		case "rchar":
			read = number
		case "wchar":
			write = number
		}
	}
	return read, write, true
}

// sampleTree sums the figures of root and every process descending from it.
func sampleTree(root int) (usage, bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return usage{}, false
	}
	samples := map[int]procSample{}
	children := map[int][]int{}
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil {
			continue
		}
		if sample, ok := readProcStat(pid); ok {
			samples[pid] = sample
			children[sample.ppid] = append(children[sample.ppid], pid)
		}
	}
	if _, ok := samples[root]; !ok {
		return usage{}, false
	}
	pageSize := int64(os.Getpagesize())
	var total usage
	var ticks [2]int64
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = append(queue[1:], children[pid]...)
		sample := samples[pid]
		ticks[0] += sample.utime
		ticks[1] += sample.stime
		total.rss += sample.rssPages * pageSize
		total.vsize += sample.vsize
		total.majorFaults += sample.majorFaults
		read, write, ok := readProcIO(pid)
		total.read += read
		total.write += write
		total.ioUnknown = total.ioUnknown || !ok
	}
	total.userUs = ticks[0] * 1_000_000 / clockTicksPerSecond
	total.sysUs = ticks[1] * 1_000_000 / clockTicksPerSecond
	return total, true
}

// usageSampler samples the script's tree until stopped, keeping the maxima.
type usageSampler struct {
	root     int
	out      *frames
	last     usage
	stop     chan struct{}
	finished chan struct{}
}

func usageInterval() time.Duration {
	seconds, err := strconv.Atoi(os.Getenv("SLURM_K8S_BRIDGE_USAGE_INTERVAL"))
	if err != nil || seconds <= 0 {
		return defaultUsageInterval
	}
	return time.Duration(seconds) * time.Second
}

func startUsageSampler(root int, out *frames, interval time.Duration) *usageSampler {
	sampler := &usageSampler{root: root, out: out, stop: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(sampler.finished)
		ticker := time.NewTicker(usageSampleEvery)
		defer ticker.Stop()
		var sentAt time.Time
		var sentMaxRss int64
		for {
			select {
			case <-sampler.stop:
				return
			case <-ticker.C:
			}
			now, ok := sampleTree(sampler.root)
			if !ok {
				continue
			}
			sampler.keep(now)
			// The first sample, one an interval after the last sent, or a resident set that grew.
			if sentAt.IsZero() || time.Since(sentAt) >= interval ||
				float64(sampler.last.maxRss) > float64(sentMaxRss)*usageGrowth {
				sampler.out.writeRaw('u', sampler.last.line())
				sentAt, sentMaxRss = time.Now(), sampler.last.maxRss
			}
		}
	}()
	return sampler
}

func (s *usageSampler) keep(now usage) {
	now.maxRss = max(now.rss, s.last.maxRss)
	now.maxVsize = max(now.vsize, s.last.maxVsize)
	// A reaped child whose parent ended too leaves the tree: what it used was counted already.
	now.userUs = max(now.userUs, s.last.userUs)
	now.sysUs = max(now.sysUs, s.last.sysUs)
	now.majorFaults = max(now.majorFaults, s.last.majorFaults)
	s.last = now
}

// finish sends the script's final figures: its rusage (CPU of all it reaped, the largest
// resident set among them) with the sampled maxima.
func (s *usageSampler) finish(rusage *syscall.Rusage) {
	close(s.stop)
	<-s.finished
	final := s.last
	final.userUs = max(final.userUs, rusage.Utime.Sec*1_000_000+rusage.Utime.Usec)
	final.sysUs = max(final.sysUs, rusage.Stime.Sec*1_000_000+rusage.Stime.Usec)
	final.maxRss = max(final.maxRss, rusage.Maxrss*1024)
	final.majorFaults = max(final.majorFaults, rusage.Majflt)
	s.out.writeRaw('u', final.line())
}
