package waiter

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"strconv"
	"syscall"
)

// What the daemon and the waiter agree on byte for byte: bridge/core/waiter_protocol.py.

// DigestPrefix names the digest's layout: a daemon refuses a credential that carries any other.
const DigestPrefix = "slurm-k8s-bridge-v1:"

// UsageFD is the task stream's "fd" of a line of what the task used (not output).
const UsageFD = 3

// MaxOutputFrame is the most bytes of srun output in one frame of a step's output stream.
const MaxOutputFrame = 64 * 1024

// Forwarded are the signals Slurm sends the batch script that the waiter passes on to the
// script in the pods; TERM is a cancel instead (the daemon decides whether it stops the run), KILL
// and STOP cannot be caught.
var Forwarded = []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
	syscall.SIGALRM}

// RequestDigest binds a munge credential to one request: method, path, job and body.
func RequestDigest(method, path string, jobID int64, body []byte) string {
	h := sha256.New()
	h.Write([]byte(method + "\n" + path + "\n" + strconv.FormatInt(jobID, 10) + "\n"))
	h.Write(body)
	return DigestPrefix + hex.EncodeToString(h.Sum(nil))
}

// SignOutputFrame is one frame of a step's output stream: fd (0 for the end), a 4-byte length,
// the data, then an HMAC-SHA256 over the sequence number and all before it.
func SignOutputFrame(streamKey []byte, seq uint64, fd byte, data []byte) []byte {
	frame := make([]byte, 5, 5+len(data)+sha256.Size)
	frame[0] = fd
	binary.BigEndian.PutUint32(frame[1:5], uint32(len(data)))
	frame = append(frame, data...)
	mac := hmac.New(sha256.New, streamKey)
	var seqBytes [8]byte
	binary.BigEndian.PutUint64(seqBytes[:], seq)
	mac.Write(seqBytes[:])
	mac.Write(frame)
	return mac.Sum(frame)
}

func nan() float64         { return math.NaN() }
func inf(sign int) float64 { return math.Inf(sign) }
