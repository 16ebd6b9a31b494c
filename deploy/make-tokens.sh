#!/bin/sh
# Make the accountant's two spending credentials before its first start in a container:
#
#   deploy/make-tokens.sh DIR      (docker-compose.yml expects DIR = deploy/secrets/tokens)
#
# DIR/charge.token        party A's: creates runs and charges A's edge ledgers
# DIR/label-charge.token  party B's: charges B's label ledgers
# The accountant gets both; party A gets a copy of the first only, party B of the second only.
# An existing file is kept (the parties already hold copies of it); delete one to replace it.
set -eu

if [ "$#" -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
dir=$1
umask 077
mkdir -p "$dir"
for name in charge.token label-charge.token; do
    if [ -s "$dir/$name" ]; then
        echo "kept $dir/$name"
        continue
    fi
    # 32 random bytes as 64 hex characters: one token, no whitespace. Any such token is read
    # (common/charge_token.py); the accountant's own, when it makes one, are 43 base64url characters
    token=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
    printf '%s\n' "$token" > "$dir/$name"
    echo "wrote $dir/$name"
done
if cmp -s "$dir/charge.token" "$dir/label-charge.token"; then
    echo "$0: $dir/charge.token and $dir/label-charge.token are the same token; delete one and run again" >&2
    exit 1
fi
