//go:build tools

// Package tools pins the DRA kubelet plugin the sandbox builds (kubernetes-sigs' example driver,
// mock GPUs with index and uuid attributes, injected through CDI), so go.sum covers it.
package tools

import (
	_ "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin"
)
