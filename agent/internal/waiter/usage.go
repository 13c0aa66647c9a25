package waiter

import (
	"encoding/base64"
	"math/big"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// The pods' usage, handed to Slurm's accounting: each sample of the
// in-pod agent is written over the last into the usage file the step guard made for this task.

const (
	usageDir     = "/run/slurm-k8s-bridge/usage"
	usageMagic   = "k8s-bridge-usage-v1"
	usageFields  = 9
	usageUnknown = "-"
	recordSize   = 256
)

// UsageRecord is the usage file's record for one frame's figures and the waiter's own user and
// system CPU in µs, or nil for figures that are not usageFields whole numbers (or "-").
func UsageRecord(figures string, ownCPU [2]int64) []byte {
	parts := strings.Fields(figures)
	if len(parts) != usageFields {
		return nil
	}
	for _, part := range parts {
		if part != usageUnknown && !asciiDigits([]byte(part)) {
			return nil
		}
	}
	for _, us := range ownCPU {
		parts = append(parts, strconv.FormatInt(max(0, us), 10))
	}
	limit := new(big.Int).Lsh(big.NewInt(1), 64)
	sum := new(big.Int)
	for _, part := range parts {
		if part == usageUnknown {
			continue
		}
		value, _ := new(big.Int).SetString(part, 10)
		if value.Cmp(limit) >= 0 {
			return nil
		}
		sum.Add(sum, value)
	}
	sum.Mod(sum, limit)
	line := strings.Join(append(append([]string{usageMagic}, parts...), sum.String()), " ")
	if len(line) >= recordSize {
		return nil
	}
	return []byte(line + strings.Repeat(" ", recordSize-1-len(line)) + "\n")
}

// ownCPU is this process's user and system CPU so far, with its reaped children's, in µs.
func ownCPU() [2]int64 {
	var self, children syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	us := func(tv syscall.Timeval) int64 { return tv.Sec*1_000_000 + tv.Usec }
	return [2]int64{us(self.Utime) + us(children.Utime), us(self.Stime) + us(children.Stime)}
}

// UsageFile is this task's usage file, usageDir/<slurmstepd's pid>/<this pid>, opened on the
// first sample and only if the guard made it: never created here, never through a link.
type UsageFile struct {
	path    string
	mu      sync.Mutex
	fd      int
	missing bool
}

// NewUsageFile names this task's usage file (the parent is its slurmstepd).
func NewUsageFile() *UsageFile {
	return &UsageFile{path: usageDir + "/" + strconv.Itoa(os.Getppid()) + "/" + strconv.Itoa(os.Getpid()), fd: -1}
}

// RecordFrame writes one "u" frame's sample (its base64 text, as the daemon passes it on).
func (u *UsageFile) RecordFrame(data string) {
	raw, err := pyA2bBase64(data)
	if err != nil || !isASCII(raw) {
		return
	}
	u.Record(string(raw))
}

// Record writes one sample over the last.
func (u *UsageFile) Record(figures string) {
	record := UsageRecord(figures, ownCPU())
	u.mu.Lock()
	defer u.mu.Unlock()
	if record == nil || u.missing {
		return
	}
	if u.fd < 0 {
		fd, err := syscall.Open(u.path, syscall.O_WRONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		if err != nil {
			u.missing = true
			return
		}
		u.fd = fd
	}
	if _, err := syscall.Pwrite(u.fd, record, 0); err != nil {
		u.missing = true
	}
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// pyA2bBase64 decodes base64 as Python's binascii.a2b_base64 does for what the daemon sends:
// characters outside the alphabet are skipped.
func pyA2bBase64(text string) ([]byte, error) {
	clean := make([]byte, 0, len(text))
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=' {
			clean = append(clean, c)
		}
	}
	if end := strings.IndexByte(string(clean), '='); end >= 0 {
		data := strings.TrimRight(string(clean[:end]), "=")
		return base64.RawStdEncoding.DecodeString(data)
	}
	return base64.StdEncoding.DecodeString(string(clean))
}
