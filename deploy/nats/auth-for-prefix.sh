#!/usr/bin/env bash
# Prints deploy/nats/auth.conf with the names of another queue prefix (--prefix of submit and
# the worker, TINKERFLEET_PREFIX): auth.conf is written for the default prefix "tinkerfleet",
# whose streams are TINKERFLEET_JOBS, TINKERFLEET_RESULTS and TINKERFLEET_DEAD, whose buckets are
# tinkerfleet_batches and tinkerfleet_backoff and whose subjects start with "tinkerfleet.".
# The names follow internal/queue/names.go: streams take the prefix upper-cased with '-' as
# '_', buckets the prefix with '-' as '_', subjects the prefix as it is.
#
#   deploy/nats/auth-for-prefix.sh acme-ml > auth.new && mv auth.new deploy/nats/auth.conf
#
# Not "> deploy/nats/auth.conf": the shell empties that file before the script reads it, and a
# server given an empty auth.conf starts with no users at all. The script refuses to write into
# the file it reads, and refuses an empty one.
#
# internal/cluster's TestNATSConfigPermissions runs a fleet under the output for a prefix
# other than the default.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 PREFIX [AUTH_CONF]" >&2
	exit 2
fi
prefix=$1
conf=${2:-"$(dirname "$0")/auth.conf"}
if ! [[ $prefix =~ ^[a-z][a-z0-9_-]{0,31}$ ]]; then
	echo "$0: prefix \"$prefix\" must match ^[a-z][a-z0-9_-]{0,31}\$ (as --prefix)" >&2
	exit 2
fi
if [ /dev/stdout -ef "$conf" ]; then
	echo "$0: the output is $conf, the file it reads, which the shell has just emptied: restore it (git checkout $conf), then write to a new file and move it" >&2
	exit 1
fi
if ! grep -q 'authorization' "$conf"; then
	echo "$0: $conf holds no authorization block (is it empty?): restore it from git" >&2
	exit 1
fi
if ! grep -q 'TINKERFLEET_JOBS' "$conf"; then
	echo "$0: $conf names no stream of the default prefix: it is this script's output for another prefix; run it on the auth.conf from git" >&2
	exit 1
fi
stem=$(printf '%s' "$prefix" | tr 'a-z-' 'A-Z_')  # stream names
bucket=$(printf '%s' "$prefix" | tr '-' '_')       # bucket names
# sed -E: alternation in a basic expression (\|) is GNU's only, and macOS's sed would leave the
# bucket and subject names as they were.
sed -E -e "s/TINKERFLEET_/${stem}_/g" \
	-e "s/tinkerfleet_(batches|backoff)/${bucket}_\1/g" \
	-e "s/\"tinkerfleet\.(jobs|results|dead)\./\"${prefix}.\1./g" \
	-e "s/\"tinkerfleet\.held\"/\"${prefix}.held\"/g" \
	-e "1s/.*/# Users and per-role permissions of a tinkerfleet cluster, for the prefix \"${prefix}\" (made by/" \
	-e "2s/.*/# deploy\/nats\/auth-for-prefix.sh from auth.conf, which is written for the default prefix)./" -e 3d \
	"$conf"
