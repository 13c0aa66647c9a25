// Command etcd is the etcd server, built from etcd's own module so the sandbox
// pins it in go.sum like the Kubernetes binaries.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
