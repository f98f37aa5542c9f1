#!/usr/bin/env bash
# Installs pinned npm packages into the git-ignored folder third_party/DIR: `npm_install.sh DIR name@version...`,
# unless every one is there at its version already; $NPM_FLAGS adds flags to npm install (e.g. --omit=optional).
# One folder per call's list: npm install --no-save removes from a folder what the call does not name.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=third_party/${1:?usage: scripts/npm_install.sh DIR name@version...}
shift
for pin in "$@"; do
  if [ "$(node -p "try { require('./$dir/node_modules/${pin%@*}/package.json').version } catch (e) { '' }")" \
       != "${pin##*@}" ]; then
    mkdir -p "$dir"
    # shellcheck disable=SC2086
    npm install --prefix "$dir" --no-audit --no-fund --no-save --prefer-offline ${NPM_FLAGS:-} "$@" >/dev/null
    exit 0
  fi
done
