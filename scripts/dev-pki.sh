#!/usr/bin/env bash
# scripts/dev-pki.sh DIR [WORKER_ID...]: a throwaway PKI and tokens for a
# secure tallyd, for development, the demo and tests. Never for production:
# the CA key sits beside the certificates.
#
# Makes, in DIR (each only when missing, expiring within 6 hours, not signed
# by the CA in DIR, or not matching its key; a second run changes nothing):
#   ca.crt ca.key               a CA (EC P-256, valid 2 days)
#   tallyd.crt tallyd.key       tallyd's serving certificate: SANs
#                               IP:127.0.0.1, DNS:localhost and those in
#                               $DEV_PKI_SANS (comma-separated; DNS:name,
#                               IP:address, or a bare name or address)
#   workers/ID.crt workers/ID.key   a client certificate per WORKER_ID
#                               (CN and DNS SAN = the id: tally-worker
#                               --worker_id=ID --tls_cert --tls_key)
#   admin.token                 an admin (every tenant)
#   user.token                  a user ($DEV_PKI_USER, default dev) of tenant
#                               $DEV_PKI_TENANT (default demo)
#   users.yaml                  both tokens' SHA-256 for tallyd --auth_tokens
#   worker-tokens/ID            a token per WORKER_ID, for workers without a
#                               client certificate (--token_file)
#   workers.yaml                their SHA-256 for tallyd --worker_tokens
# Tokens are 64 hex characters (openssl rand -hex 32); keys and tokens are
# 0600. Only paths are printed, never a key or a token.
set -euo pipefail

usage() {
  echo "usage: $0 DIR [WORKER_ID...]   (env: DEV_PKI_SANS, DEV_PKI_TENANT, DEV_PKI_USER)" >&2
  exit 2
}
[ $# -ge 1 ] && [ -n "$1" ] || usage
case "$1" in -h|--help) usage ;; esac
command -v openssl >/dev/null || { echo "dev-pki: openssl is not installed" >&2; exit 1; }

DIR=$1
shift
TENANT=${DEV_PKI_TENANT:-demo}
USER_NAME=${DEV_PKI_USER:-dev}
NAME_RE='^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$'
for v in "TENANT=$TENANT" "USER=$USER_NAME"; do
  [[ ${v#*=} =~ $NAME_RE ]] || {
    echo "dev-pki: DEV_PKI_${v%%=*}=\"${v#*=}\" is not a name (letters, digits, . _ -)" >&2
    exit 2
  }
done
WORKERS=()
for id in "$@"; do
  [[ $id =~ $NAME_RE ]] || {
    echo "dev-pki: worker id \"$id\" is not a name (letters, digits, . _ -, at most 63)" >&2
    exit 2
  }
  WORKERS+=("$id")
done

# The server's SANs: the loopback ones, then $DEV_PKI_SANS.
SANS="IP:127.0.0.1,DNS:localhost"
IFS=',' read -r -a extra <<<"${DEV_PKI_SANS:-}"
for san in "${extra[@]}"; do
  san=${san//[[:space:]]/}
  [ -n "$san" ] || continue
  case "$san" in
    DNS:*|IP:*) ;;
    *) if [[ $san =~ ^[0-9.]+$ || $san == *:* ]]; then san="IP:$san"; else san="DNS:$san"; fi ;;
  esac
  value=${san#*:}
  if [[ $san == DNS:* && ! $value =~ ^(\*\.)?[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]] ||
     [[ $san == IP:* && ! $value =~ ^[0-9A-Fa-f.:]+$ ]]; then
    echo "dev-pki: DEV_PKI_SANS: \"$san\" is not a DNS name or an IP address" >&2
    exit 2
  fi
  [[ ,$SANS, == *,$san,* ]] || SANS="$SANS,$san"
done

umask 077
mkdir -p "$DIR/workers" "$DIR/worker-tokens"
exec 9>"$DIR/.lock"
flock 9
# Workers made by an earlier run are kept valid too (a new CA re-signs them).
for crt in "$DIR"/workers/*.crt; do
  [ -f "$crt" ] || continue
  id=$(basename "$crt" .crt)
  [[ $id =~ $NAME_RE && " ${WORKERS[*]} " != *" $id "* ]] && WORKERS+=("$id")
done

DAYS=2
MARGIN_SECONDS=21600
made=()
kept=()

ossl() {
  local out
  if ! out=$(openssl "$@" 2>&1); then
    echo "dev-pki: openssl $1 failed:" >&2
    echo "$out" >&2
    exit 1
  fi
}

# usable CERT KEY: the pair exists, matches, and lasts another 6 hours; with
# a third argument, it is also signed by the CA in DIR.
usable() {
  [ -s "$1" ] && [ -s "$2" ] || return 1
  openssl x509 -in "$1" -noout -checkend "$MARGIN_SECONDS" >/dev/null 2>&1 || return 1
  [ "$(openssl x509 -in "$1" -noout -pubkey 2>/dev/null)" = \
    "$(openssl pkey -in "$2" -pubout 2>/dev/null)" ] || return 1
  [ $# -lt 3 ] || openssl verify -CAfile "$DIR/ca.crt" "$1" >/dev/null 2>&1
}

# leaf NAME CN EXTENSIONS: a key and a certificate signed by the CA, written
# beside each other only once both exist.
leaf() {
  local name=$1 cn=$2 ext=$3
  ossl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$DIR/$name.key.tmp" -out "$DIR/$name.csr.tmp" -subj "/CN=$cn"
  ossl x509 -req -in "$DIR/$name.csr.tmp" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$DAYS" -sha256 \
    -extfile <(printf '%s\n' "$ext") -out "$DIR/$name.crt.tmp"
  chmod 600 "$DIR/$name.key.tmp"
  chmod 644 "$DIR/$name.crt.tmp"
  mv -f "$DIR/$name.key.tmp" "$DIR/$name.key"
  mv -f "$DIR/$name.crt.tmp" "$DIR/$name.crt"
  rm -f "$DIR/$name.csr.tmp"
}

if usable "$DIR/ca.crt" "$DIR/ca.key"; then
  kept+=(ca)
else
  ossl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$DIR/ca.key.tmp" -out "$DIR/ca.crt.tmp" -days "$DAYS" -sha256 \
    -subj "/CN=Tally development CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign"
  chmod 600 "$DIR/ca.key.tmp"
  chmod 644 "$DIR/ca.crt.tmp"
  mv -f "$DIR/ca.key.tmp" "$DIR/ca.key"
  mv -f "$DIR/ca.crt.tmp" "$DIR/ca.crt"
  made+=(ca)
fi

if usable "$DIR/tallyd.crt" "$DIR/tallyd.key" signed &&
   [ "$(cat "$DIR/tallyd.sans" 2>/dev/null)" = "$SANS" ]; then
  kept+=(tallyd)
else
  leaf tallyd tallyd "$(printf '%s\n' "subjectAltName=$SANS" "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth")"
  printf '%s\n' "$SANS" >"$DIR/tallyd.sans"
  chmod 644 "$DIR/tallyd.sans"
  made+=(tallyd)
fi

for id in "${WORKERS[@]}"; do
  if usable "$DIR/workers/$id.crt" "$DIR/workers/$id.key" signed; then
    kept+=("workers/$id")
  else
    leaf "workers/$id" "$id" "$(printf '%s\n' "subjectAltName=DNS:$id" \
      "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
      "extendedKeyUsage=clientAuth")"
    made+=("workers/$id")
  fi
done

# token FILE: a random token, made once.
token() {
  if [ -s "$1" ]; then
    kept+=("${1#"$DIR"/}")
    return
  fi
  openssl rand -hex 32 >"$1.tmp"
  chmod 600 "$1.tmp"
  mv -f "$1.tmp" "$1"
  made+=("${1#"$DIR"/}")
}
digest() { tr -d '[:space:]' <"$1" | sha256sum | cut -d' ' -f1; }

token "$DIR/admin.token"
token "$DIR/user.token"
for id in "${WORKERS[@]}"; do token "$DIR/worker-tokens/$id"; done

# The token files tallyd reads: rewritten from the tokens on every run, so
# they always match them. workers.yaml admits every worker token in DIR.
{
  echo "principals:"
  printf '  - {name: admin, tenant: "", role: admin, token_sha256: "%s"}\n' \
    "$(digest "$DIR/admin.token")"
  printf '  - {name: %s, tenant: %s, role: user, token_sha256: "%s"}\n' \
    "$USER_NAME" "$TENANT" "$(digest "$DIR/user.token")"
} >"$DIR/users.yaml.tmp"
mv -f "$DIR/users.yaml.tmp" "$DIR/users.yaml"
worker_ids=()
for f in "$DIR"/worker-tokens/*; do
  [ -f "$f" ] && [[ $(basename "$f") =~ $NAME_RE ]] && worker_ids+=("$(basename "$f")")
done
{
  if [ ${#worker_ids[@]} -eq 0 ]; then
    echo "principals: []"
  else
    echo "principals:"
    for id in "${worker_ids[@]}"; do
      printf '  - {name: %s, role: worker, token_sha256: "%s"}\n' \
        "$id" "$(digest "$DIR/worker-tokens/$id")"
    done
  fi
} >"$DIR/workers.yaml.tmp"
mv -f "$DIR/workers.yaml.tmp" "$DIR/workers.yaml"

until=$(openssl x509 -in "$DIR/ca.crt" -noout -enddate | cut -d= -f2)
echo "dev-pki: $DIR (CA valid until $until)"
echo "  made: ${made[*]:-nothing}; kept: ${kept[*]:-nothing}"
echo "  tallyd --tls_cert=$DIR/tallyd.crt --tls_key=$DIR/tallyd.key --client_ca=$DIR/ca.crt" \
     "--auth_tokens=$DIR/users.yaml [--worker_tokens=$DIR/workers.yaml]   (SANs: $SANS)"
echo "  users: admin ($DIR/admin.token), $USER_NAME of tenant $TENANT ($DIR/user.token)"
if [ ${#WORKERS[@]} -gt 0 ]; then
  echo "  workers: $DIR/workers/ID.crt and .key (or --token_file=$DIR/worker-tokens/ID)" \
       "for ID in ${WORKERS[*]}"
fi
