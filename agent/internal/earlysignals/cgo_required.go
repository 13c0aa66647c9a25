//go:build !cgo

package earlysignals

// Without cgo there is no C constructor, and a signal pending at the waiter's start (held by the
// SPANK guard) would end it: the waiter is built with CGO_ENABLED=1 (see cmd/waiter/main.go).
var _ = theWaiterMustBeBuiltWithCgo
