#!/usr/bin/env bash
# Makes a private CA and certificates for TLS between ps-server, ps-master and clients:
#   DIR/ca.crt, ca.key              the CA (keep ca.key offline in production)
#   DIR/server.crt, server.key      for ps-server and ps-master (--tls_cert/--tls_key)
#   DIR/client.crt, client.key      for workers under mutual TLS (common name ps-client)
#   DIR/admin.crt, admin.key        for ps-admin / ps-transfer under mutual TLS (common name
#                                   ps-admin: list it in the servers' --admin_identities)
# ps-server and ps-master present server.crt when they call each other; with
# --admin_identities, list ps-server there too (or give them --admin_token_file).
# The server certificate names every SAN given (DNS names or IPs), plus localhost and
# 127.0.0.1. For Kubernetes give the Services' names, e.g.
#   scripts/make-certs.sh certs '*.ps-headless.ps.svc' 'ps-master.ps.svc' 'ps-master'
# Usage: scripts/make-certs.sh DIR [SAN...]   (needs openssl; valid for 825 days)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [SAN...]" >&2; exit 2; }
dir="$1"
shift
mkdir -p "$dir"
cd "$dir"
sans="DNS:localhost,IP:127.0.0.1"
for s in "$@"; do
  if [[ "$s" =~ ^[0-9.]+$ || "$s" == *:*:* ]]; then sans+=",IP:$s"; else sans+=",DNS:$s"; fi
done
days=825
q() { "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }; }
q openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days "$days" \
  -subj "/CN=elastic-ps test CA"
for who in server client admin; do
  q openssl req -newkey rsa:2048 -nodes -keyout "$who.key" -out "$who.csr" -subj "/CN=ps-$who"
  if [ "$who" = server ]; then
    ext="subjectAltName=$sans
extendedKeyUsage=serverAuth,clientAuth"
  else
    ext="extendedKeyUsage=clientAuth"
  fi
  printf '%s\n' "$ext" >"$who.ext"
  q openssl x509 -req -in "$who.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$who.crt" \
    -days "$days" -extfile "$who.ext"
  rm -f "$who.csr" "$who.ext"
done
rm -f ca.srl
chmod 600 ./*.key
echo "certificates in $dir: ca.crt server.crt/key client.crt/key admin.crt/key (SANs $sans)"
