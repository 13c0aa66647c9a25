//go:build tools

// Package tools pins kwok so go.sum covers it; kept apart from the Kubernetes
// module because kwok wants its own versions of the shared k8s.io libraries.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
