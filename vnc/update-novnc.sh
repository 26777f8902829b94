#!/usr/bin/env bash
# Replace vnc/novnc/ with noVNC VERSION from the npm registry's @novnc/novnc: what the
# browser loads (core/, vendor/pako/) and the licence texts, nothing else. npm checks the
# tarball against the registry's sha512; we check it against INTEGRITY when given and record
# both in novnc/PINNED, and every vendored file's sha256 in novnc/SHA256SUMS (the JS test
# checks them, so a hand edit of noVNC shows). Then run `make test`: the live-view tests
# load the page with this noVNC in Chromium.
#   vnc/update-novnc.sh 1.7.0 [sha512-...]
set -euo pipefail
cd "$(dirname "$0")"
version=${1:?usage: vnc/update-novnc.sh VERSION [INTEGRITY]}
expected=${2:-}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

(cd "$scratch" && npm pack --silent "@novnc/novnc@$version" >/dev/null)
tarball="$scratch/novnc-novnc-$version.tgz"
integrity="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
if [ -n "$expected" ] && [ "$integrity" != "$expected" ]; then
  echo "update-novnc: $tarball is $integrity, not $expected" >&2
  exit 1
fi
tar -xzf "$tarball" -C "$scratch"
package="$scratch/package"

rm -rf novnc
mkdir -p novnc/docs
cp -r "$package/core" "$package/vendor" "$package/LICENSE.txt" "$package/AUTHORS" novnc/
cp "$package"/docs/LICENSE.* novnc/docs/
printf '@novnc/novnc %s\n%s\n' "$version" "$integrity" > novnc/PINNED
(cd novnc && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort \
  | xargs sha256sum > SHA256SUMS)
echo "update-novnc: vnc/novnc/ is noVNC $version ($integrity)"
