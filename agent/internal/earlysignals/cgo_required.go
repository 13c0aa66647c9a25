//go:build !cgo

package earlysignals

// Without cgo there is no C constructor: a signal pending at the waiter's start (held by the
// SPANK guard) would end it, and the job's GODEBUG... would steer its runtime. The waiter is built
// with CGO_ENABLED=1 (see cmd/waiter/main.go).
var _ = theWaiterMustBeBuiltWithCgo
