#!/usr/bin/env python3
"""Write a single-layer OCI image archive (what `ctr images import` reads)
from a root filesystem directory, without Docker.

Usage: mkimage.py --rootfs DIR --name REF --out FILE.tar
                  [--entrypoint JSON] [--cmd JSON] [--env K=V ...] [--workdir D]

Several images made from the same DIR share the layer blob (same digest).
The layer is an uncompressed tar: import is faster and nothing leaves the host.
"""
import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def add_bytes(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--name", required=True, help="full reference, e.g. sandbox.local/busybox:1")
    ap.add_argument("--out", required=True)
    ap.add_argument("--entrypoint", type=json.loads)
    ap.add_argument("--cmd", type=json.loads)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--workdir", default="/")
    a = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(a.out))) as tmp:
        layer = os.path.join(tmp, "layer.tar")
        # GNU tar is much faster than tarfile on a 100 MB tree; sorted names and
        # numeric owners make the digest depend on content only.
        entries = sorted(os.listdir(a.rootfs))
        subprocess.run(
            ["tar", "--numeric-owner", "--sort=name", "--xattrs", "-C", a.rootfs,
             "-cf", layer, "--"] + entries, check=True)
        layer_digest = sha256_file(layer)
        layer_size = os.path.getsize(layer)

        # A PATH given replaces the default one (a runtime would take either of two).
        env = [e for e in ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
               if not any(given.startswith("PATH=") for given in a.env)] + a.env
        cfg = {"Env": env, "WorkingDir": a.workdir}
        if a.entrypoint is not None:
            cfg["Entrypoint"] = a.entrypoint
        if a.cmd is not None:
            cfg["Cmd"] = a.cmd
        config = json.dumps({
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_digest]},
            "history": [{"created": "1970-01-01T00:00:00Z",
                         "created_by": "containers/images/mkimage.py"}],
        }, sort_keys=True).encode()
        config_digest = hashlib.sha256(config).hexdigest()
        manifest = json.dumps({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": "sha256:" + config_digest, "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": "sha256:" + layer_digest, "size": layer_size}],
        }, sort_keys=True).encode()
        manifest_digest = hashlib.sha256(manifest).hexdigest()
        index = json.dumps({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": "sha256:" + manifest_digest, "size": len(manifest),
                "platform": {"architecture": "amd64", "os": "linux"},
                # ctr uses io.containerd.image.name as the image name.
                "annotations": {"io.containerd.image.name": a.name,
                                "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1]},
            }],
        }, sort_keys=True).encode()

        tmp_out = a.out + ".tmp"
        with tarfile.open(tmp_out, "w", format=tarfile.PAX_FORMAT) as t:
            add_bytes(t, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            add_bytes(t, "index.json", index)
            add_bytes(t, "blobs/sha256/" + manifest_digest, manifest)
            add_bytes(t, "blobs/sha256/" + config_digest, config)
            t.add(layer, "blobs/sha256/" + layer_digest)
        os.replace(tmp_out, a.out)
    # The manifest digest is what containerd lists as the image target.
    print("sha256:" + manifest_digest)


if __name__ == "__main__":
    sys.exit(main())
