# PKI and kubeconfigs for the kube sandbox. Sourced by up.sh (needs common.sh).
# Certificates are made once (missing ones only) into $KUBE_PKI; kubeconfigs
# are rewritten on each up (cheap) so a changed port takes effect.
# EC P-256 keys: generated in milliseconds, accepted by every component.

_pki_key() { [ -s "$1" ] || openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# pki_cert NAME CN O KIND [SAN...]: NAME.crt/.key signed by the CA.
# KIND: client | server. SANs as openssl wants them (DNS:x, IP:y).
pki_cert() {
  local name=$1 cn=$2 o=$3 kind=$4 subj eku ext
  shift 4
  # Made again when its names change (e.g. a new SBX_CONTROL_IP).
  [ -s "$KUBE_PKI/$name.crt" ] && [ "$(cat "$KUBE_PKI/$name.names" 2>/dev/null)" = "$cn $o $*" ] && return 0
  _pki_key "$KUBE_PKI/$name.key"
  subj="/CN=$cn"
  [ -n "$o" ] && subj="/O=$o$subj"
  if [ "$kind" = server ]; then eku=serverAuth; else eku=clientAuth; fi
  ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=$eku"
  if [ $# -gt 0 ]; then ext="$ext
subjectAltName=$(IFS=,; echo "$*")"; fi
  openssl req -new -key "$KUBE_PKI/$name.key" -subj "$subj" 2>/dev/null |
    openssl x509 -req -CA "$KUBE_PKI/ca.crt" -CAkey "$KUBE_PKI/ca.key" -CAcreateserial \
      -days 3650 -extfile <(echo "$ext") -out "$KUBE_PKI/$name.crt.tmp" 2>/dev/null
  mv "$KUBE_PKI/$name.crt.tmp" "$KUBE_PKI/$name.crt"
  echo "$cn $o $*" >"$KUBE_PKI/$name.names"
}

pki_ensure() {
  local n
  mkdir -p "$KUBE_PKI"
  chmod 700 "$KUBE_PKI"
  if [ ! -s "$KUBE_PKI/ca.crt" ]; then
    _pki_key "$KUBE_PKI/ca.key"
    openssl req -x509 -new -key "$KUBE_PKI/ca.key" -subj "/CN=slurm-k8s-sandbox-ca" \
      -days 3650 -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -out "$KUBE_PKI/ca.crt" 2>/dev/null
  fi
  pki_cert apiserver kube-apiserver "" server \
    DNS:localhost DNS:kubernetes DNS:kubernetes.default DNS:kubernetes.default.svc \
    DNS:kubernetes.default.svc.cluster.local IP:127.0.0.1 IP:"$KUBE_SERVICE_IP" IP:"$SBX_CONTROL_IP"
  # apiserver -> kubelet (logs/exec). system:masters passes the kubelets'
  # webhook authorization without extra RBAC.
  pki_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters client
  pki_cert admin kubernetes-admin system:masters client
  pki_cert controller-manager system:kube-controller-manager "" client
  pki_cert scheduler system:kube-scheduler "" client
  # kwok patches node/pod status, leases and deletes pods of 1,000 nodes: admin
  # rights keep it simple (it is a simulator, not a security boundary).
  pki_cert kwok system:kwok-controller system:masters client
  for n in $SBX_REAL_NODES; do
    pki_cert "kubelet-$n" "system:node:$n" system:nodes client
  done
  # kube-proxy: the built-in binding gives this user system:node-proxier.
  pki_cert kube-proxy system:kube-proxy "" client
  # Service-account token signing pair.
  if [ ! -s "$KUBE_PKI/sa.pub" ]; then
    _pki_key "$KUBE_PKI/sa.key"
    openssl pkey -in "$KUBE_PKI/sa.key" -pubout -out "$KUBE_PKI/sa.pub" 2>/dev/null
  fi
}

# write_kubeconfig FILE CERTNAME USER: certs embedded so the file can be copied
# (e.g. into a Slurm rootfs or a pod) and still work.
write_kubeconfig() {
  local file=$1 cert=$2 user=$3
  cat >"$file.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sandbox
  cluster:
    server: https://127.0.0.1:$SBX_APISERVER_PORT
    certificate-authority-data: $(base64 -w0 <"$KUBE_PKI/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 <"$KUBE_PKI/$cert.crt")
    client-key-data: $(base64 -w0 <"$KUBE_PKI/$cert.key")
contexts:
- name: $user@sandbox
  context: {cluster: sandbox, user: $user}
current-context: $user@sandbox
EOF
  chmod 600 "$file.tmp"
  mv "$file.tmp" "$file"
}

kubeconfigs_ensure() {
  local n
  write_kubeconfig "$ADMIN_KUBECONFIG" admin admin
  write_kubeconfig "$KUBE_STATE/controller-manager.kubeconfig" controller-manager system:kube-controller-manager
  write_kubeconfig "$KUBE_STATE/scheduler.kubeconfig" scheduler system:kube-scheduler
  write_kubeconfig "$KUBE_STATE/kwok.kubeconfig" kwok kwok
  write_kubeconfig "$KUBE_STATE/kube-proxy.kubeconfig" kube-proxy system:kube-proxy
  for n in $SBX_REAL_NODES; do
    write_kubeconfig "$KUBE_STATE/kubelet-$n.kubeconfig" "kubelet-$n" "system:node:$n"
  done
}
