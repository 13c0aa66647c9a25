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
//
// Whatever ROOT holds runs in every job of the node: a ROOT another user could write is refused,
// an installed file is used only if its digest is its directory's name, and temporary names are
// unique (two installers may run at once on a node during a rolling update).

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

func installOnNode(root string, stay bool) {
	if !filepath.IsAbs(root) {
		fail("install-on-node: not an absolute path: " + root)
	}
	version, err := digestOf(mustExecutable())
	if err != nil {
		fail(err.Error())
	}
	if _, err := os.Lstat(root); err != nil {
		// World-readable and -executable whatever the umask: the pods run as their jobs' users.
		if err := os.MkdirAll(root, 0o755); err != nil {
			fail(err.Error())
		}
		if err := os.Chmod(root, 0o755); err != nil {
			fail(err.Error())
		}
	}
	refuseUnsafe(root)
	dir := filepath.Join(root, version)
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		fail(err.Error())
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		fail(err.Error())
	}
	refuseUnsafe(dir)
	dest := filepath.Join(dir, agentBinary)
	if installed, err := digestOf(dest); err != nil || installed != version {
		copySelf(dest)
	}
	syncDir(dir)
	link := filepath.Join(root, "current")
	if target, err := os.Readlink(link); err != nil || target != version {
		tmp := uniqueName(link)
		if err := os.Symlink(version, tmp); err != nil {
			fail(err.Error())
		}
		if err := os.Rename(tmp, link); err != nil {
			_ = os.Remove(tmp)
			fail(err.Error())
		}
		syncDir(root)
	}
	fmt.Fprintf(os.Stderr, "slurm-k8s-bridge-agent: %s is version %s\n", link, version)
	if stay {
		hold()
	}
}

// digestOf is the first 16 hex digits of the file's SHA-256: a version's name.
func digestOf(path string) (string, error) {
	file, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer file.Close()
	digest := sha256.New()
	if _, err := io.Copy(digest, file); err != nil {
		return "", err
	}
	return hex.EncodeToString(digest.Sum(nil))[:16], nil
}

// refuseUnsafe fails unless path is a real directory owned by this installer's user (root, on a
// node) that no one else may write: else its owner could plant what every job runs.
func refuseUnsafe(path string) {
	info, err := os.Lstat(path)
	if err != nil {
		fail(err.Error())
	}
	stat, ok := info.Sys().(*syscall.Stat_t)
	if !info.IsDir() || !ok || int(stat.Uid) != os.Geteuid() || info.Mode().Perm()&0o022 != 0 {
		fail(fmt.Sprintf("install-on-node: %s must be a directory of uid %d that only it may write (%v)",
			path, os.Geteuid(), info.Mode()))
	}
}

// uniqueName is a fresh name beside path, for a file renamed onto it.
func uniqueName(path string) string {
	file, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		fail(err.Error())
	}
	name := file.Name()
	_ = file.Close()
	_ = os.Remove(name)
	return name
}

// copySelf writes this binary to dest (0755) through a temporary name, synced before the rename:
// the path appears whole, after a power loss too.
func copySelf(dest string) {
	in, err := os.Open(mustExecutable())
	if err != nil {
		fail(err.Error())
	}
	defer in.Close()
	out, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".*")
	if err != nil {
		fail(err.Error())
	}
	tmp := out.Name()
	defer os.Remove(tmp) // gone once renamed; left only by a failure
	if _, err := io.Copy(out, in); err != nil {
		fail(err.Error())
	}
	if err := out.Chmod(0o755); err != nil {
		fail(err.Error())
	}
	if err := out.Sync(); err != nil {
		fail(err.Error())
	}
	if err := out.Close(); err != nil {
		fail(err.Error())
	}
	if err := os.Rename(tmp, dest); err != nil {
		fail(err.Error())
	}
}

func syncDir(path string) {
	if dir, err := os.Open(path); err == nil {
		_ = dir.Sync()
		_ = dir.Close()
	}
}
