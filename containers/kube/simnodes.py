#!/usr/bin/env python3
"""Create the missing simulated (kwok) Node objects, straight over the API.

Usage: simnodes.py [--delete] PKI_DIR APISERVER_PORT NAME...
       simnodes.py --delete-set SET PKI_DIR APISERVER_PORT

kubectl posts one object per request after a discovery round trip and costs
~10 s for 1,000 nodes here; four keep-alive connections do it in ~2 s.
Each node: label slurm-k8s-bridge/bridged=true + type=kwok, taint
slurm-k8s-bridge/bridged=true:NoSchedule, 64 cpu / 256Gi / 1000 pods, its own
fake pod CIDR from 10.128.0.0/9, and an InternalIP only: without a Hostname
address the apiserver (--kubelet-preferred-address-types=Hostname) fails
`kubectl logs` on a simulated pod at once instead of dialling a fake IP.
With --delete, deletes those nodes the same way (kubectl deletes 1,000 one by one in ~100 s).
With SIMNODES_SET=SET in the environment, the nodes made are labelled
slurm-k8s-bridge.sandbox/set=SET, and --delete-set SET deletes them all in one request: the API
server removes 1,000 in ~4 s, where one DELETE each takes ~100 s here.
"""
import http.client
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse

SET_LABEL = "slurm-k8s-bridge.sandbox/set"
delete = sys.argv[1:2] == ["--delete"]
delete_set = sys.argv[2] if sys.argv[1:2] == ["--delete-set"] else None
args = sys.argv[3:] if delete_set else sys.argv[2:] if delete else sys.argv[1:]
pki, port, names = args[0], int(args[1]), args[2:]
node_set = os.environ.get("SIMNODES_SET", "")


def connect():
    ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
    ctx.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))
    return http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)


now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
conditions = [
    {"type": t, "status": st, "reason": r, "message": m,
     "lastHeartbeatTime": now, "lastTransitionTime": now}
    for t, st, r, m in [
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"),
    ]]
kwok = "kwok-" + os.environ.get("SBX_KWOK_VERSION", "v0.7.0")
node_info = {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": kwok,
             "kubeProxyVersion": kwok, "containerRuntimeVersion": kwok, "kernelVersion": kwok,
             "osImage": "", "machineID": "", "systemUUID": "", "bootID": ""}


def node(name):
    i = int(name[4:])
    net = "10.%d.%d" % (128 + (i >> 8), i & 255)
    res = {"cpu": "64", "memory": "256Gi", "pods": "1000", "ephemeral-storage": "1Ti"}
    labels = {"slurm-k8s-bridge/bridged": "true", "type": "kwok", "kubernetes.io/hostname": name,
              "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    if node_set:
        labels[SET_LABEL] = node_set
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": net + ".0/24", "podCIDRs": [net + ".0/24"],
                 "taints": [{"key": "slurm-k8s-bridge/bridged", "value": "true",
                             "effect": "NoSchedule"}]},
        # Status is kept on create (as for a kubelet registering itself).
        # Created Ready, so kwok's node-initialize stage has nothing to patch
        # (half the API writes of 1,000 nodes); kwok then keeps the lease.
        "status": {"capacity": res, "allocatable": res,
                   "addresses": [{"type": "InternalIP", "address": net + ".1"}],
                   "conditions": conditions, "phase": "Running",
                   "nodeInfo": node_info},
    }


def existing():
    c = connect()
    c.request("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")
    r = c.getresponse()
    body = r.read()
    if r.status != 200:
        sys.exit("list nodes: HTTP %d %s" % (r.status, body[:200]))
    return {n["metadata"]["name"] for n in json.loads(body)["items"]}


errors = []


def worker(batch):
    c = connect()
    for name in batch:
        c.request("POST", "/api/v1/nodes", json.dumps(node(name)),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        if r.status not in (201, 409):  # 409: created meanwhile, fine
            errors.append("%s: HTTP %d %s" % (name, r.status, body[:200]))


def deleter(batch):
    c = connect()
    for name in batch:
        c.request("DELETE", "/api/v1/nodes/" + name)
        r = c.getresponse()
        body = r.read()
        if r.status not in (200, 404):  # 404: gone already, fine
            errors.append("%s: HTTP %d %s" % (name, r.status, body[:200]))


if delete_set:
    c = connect()
    c.request("DELETE", "/api/v1/nodes?labelSelector=" + urllib.parse.quote(f"{SET_LABEL}={delete_set}"))
    r = c.getresponse()
    body = r.read()
    if r.status != 200:
        sys.exit("delete nodes of set %s: HTTP %d %s" % (delete_set, r.status, body[:200]))
    print(len(json.loads(body).get("items") or []))
    sys.exit(0)
if delete:
    missing = [n for n in names if n in existing()]
else:
    missing = [n for n in names if n not in existing()]
threads = [threading.Thread(target=deleter if delete else worker, args=(missing[k::4],)) for k in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    sys.exit("\n".join(errors[:5]))
print(len(missing))
