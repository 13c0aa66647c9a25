package main

// The agent on the node ([pods] agent_host_dir): `install-on-node ROOT [hold]` puts this binary in
// ROOT/<version>/ and points ROOT/current at it, for job pods to mount read-only. The Helm
// chart's DaemonSet runs it with "hold" (a DaemonSet's pod must keep running); the sandbox runs it
// once at sandbox-up.
//
// The version is the binary's own digest, so that an upgrade never writes into a directory a
// running pod has mounted: the kubelet resolves `current` when a pod starts, and that pod keeps the
// directory it got. `current` changes by one rename, so a pod starting meanwhile sees the old
// version or the new one, never half of one. Old versions stay: a pod of a job with a long time
// limit may still run one (docs/operations.md says when to remove them).

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

func installOnNode(root string, stay bool) {
	if !filepath.IsAbs(root) {
		fail("install-on-node: not an absolute path: " + root)
	}
	self, err := os.Open(mustExecutable())
	if err != nil {
		fail(err.Error())
	}
	digest := sha256.New()
	if _, err := io.Copy(digest, self); err != nil {
		fail(err.Error())
	}
	_ = self.Close()
	version := hex.EncodeToString(digest.Sum(nil))[:16]
	dir := filepath.Join(root, version)
	// World-readable and -executable whatever the umask: the pods run as their jobs' users. A root
	// that exists already keeps the mode its owner gave it.
	for _, made := range []string{root, dir} {
		if _, err := os.Stat(made); err == nil && made == root {
			continue
		}
		if err := os.MkdirAll(made, 0o755); err != nil {
			fail(err.Error())
		}
		if err := os.Chmod(made, 0o755); err != nil {
			fail(err.Error())
		}
	}
	dest := filepath.Join(dir, "slurm-k8s-bridge-agent")
	if _, err := os.Stat(dest); err != nil {
		copySelf(dest)
	}
	link := filepath.Join(root, "current")
	if target, err := os.Readlink(link); err != nil || target != version {
		tmp := fmt.Sprintf("%s.%d", link, os.Getpid())
		_ = os.Remove(tmp)
		if err := os.Symlink(version, tmp); err != nil {
			fail(err.Error())
		}
		if err := os.Rename(tmp, link); err != nil {
			fail(err.Error())
		}
	}
	fmt.Fprintf(os.Stderr, "slurm-k8s-bridge-agent: %s is version %s\n", link, version)
	if stay {
		hold()
	}
}

// copySelf writes this binary to dest (0755) through a temporary name: the path appears whole.
func copySelf(dest string) {
	in, err := os.Open(mustExecutable())
	if err != nil {
		fail(err.Error())
	}
	defer in.Close()
	tmp := fmt.Sprintf("%s.%d.tmp", dest, os.Getpid())
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		fail(err.Error())
	}
	if _, err := io.Copy(out, in); err != nil {
		fail(err.Error())
	}
	if err := out.Chmod(0o755); err != nil {
		fail(err.Error())
	}
	if err := out.Close(); err != nil {
		fail(err.Error())
	}
	if err := os.Rename(tmp, dest); err != nil {
		fail(err.Error())
	}
}
