//go:build tools

// Package tools pins the helm command the sandbox builds, so go.sum covers it.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
